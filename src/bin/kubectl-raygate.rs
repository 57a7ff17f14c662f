//! `kubectl raygate`: kubectl runs this binary when it is on `PATH`. The
//! same commands are `raygate approve|pause|resume|queue|explain|fit`, and the
//! `raygate` binary itself runs as this plugin when started under the name
//! `kubectl-raygate` (how the release ships it: [`raygate::kubectl::plugin`]).

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    raygate::kubectl::plugin::main().await
}
