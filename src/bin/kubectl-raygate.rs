//! `kubectl raygate`: kubectl runs this binary when it is on `PATH`. The
//! same commands are `raygate approve|pause|resume|queue|explain|fit`.

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

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
struct Cli {
    #[command(subcommand)]
    command: raygate::kubectl::Command,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    raygate::kubectl::run(cli.command, Cli::command(), "kubectl-raygate").await
}
