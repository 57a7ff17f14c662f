//! Locating binaries built in the same workspace (e.g. the future `raygate` operator)
//! from a test executable, which lives in `target/<profile>/deps/`.

use std::path::PathBuf;

/// `target/<profile>/<name>` next to the running test executable, if it exists.
pub fn workspace_bin(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let mut dir = exe.parent()?.to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let candidate = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    candidate.is_file().then_some(candidate)
}
