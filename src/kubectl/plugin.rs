//! The `kubectl raygate` entry point, shared by the `kubectl-raygate` binary
//! (`cargo install`) and by `raygate` itself when it is started under that name:
//! the release's plugin archive ships the `raygate` binary as `kubectl-raygate`,
//! so one static binary is built and released, not two (the second one cost a
//! third of the release build's CPU).

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

/// The name kubectl looks for on `PATH`.
pub const BINARY: &str = "kubectl-raygate";

/// raygate's commands for a live cluster: approve, pause and resume
/// upgrades, see the queue, and explain or fit a RayService before applying it.
///
/// Exit codes: 0 done; 1 invalid input, or the object does not allow it;
/// 2 usage; 3 no fit with --fail-if-no-fit; 4 the cluster could not be
/// reached or refused the request.
#[derive(Parser, Debug)]
#[command(
    name = "kubectl-raygate",
    bin_name = "kubectl raygate",
    version,
    about,
    long_about
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: super::Command,
}

/// Whether a program started as `argv0` is the kubectl plugin (its file name,
/// whatever the directory, is `kubectl-raygate`, with `.exe` on Windows).
pub fn invoked_as_plugin(argv0: &std::ffi::OsStr) -> bool {
    std::path::Path::new(argv0)
        .file_stem()
        .is_some_and(|s| s == BINARY)
}

/// Parses the command line as `kubectl raygate` and runs it.
pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    super::run(cli.command, Cli::command(), BINARY).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_is_recognised_by_its_file_name_only() {
        assert!(invoked_as_plugin("kubectl-raygate".as_ref()));
        assert!(invoked_as_plugin("/usr/local/bin/kubectl-raygate".as_ref()));
        assert!(invoked_as_plugin(
            "C:/krew/bin/kubectl-raygate.exe".as_ref()
        ));
        assert!(!invoked_as_plugin("/raygate".as_ref()));
        assert!(!invoked_as_plugin("/opt/kubectl-raygate/raygate".as_ref()));
        assert!(!invoked_as_plugin("kubectl-raygate-old".as_ref()));
    }

    #[test]
    fn the_plugin_command_line_is_valid() {
        Cli::command().debug_assert();
    }
}
