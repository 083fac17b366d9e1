//! The `zygvm` binary as a command, for the tests that run the command line.
//!
//! A cross-built test run (`cargo test --target aarch64-unknown-linux-gnu`, the test binaries
//! run by the emulator `.cargo/config.toml` names) builds an AArch64 `zygvm` that this host
//! cannot execute directly: `ZYGVM_TEST_RUNNER` names the same emulator (with its arguments,
//! split at spaces), and every command is run through it. Unset, the binary runs directly.

use std::process::Command;

pub fn zygvm() -> Command {
    let bin = env!("CARGO_BIN_EXE_zygvm");
    match std::env::var("ZYGVM_TEST_RUNNER") {
        Ok(runner) if !runner.trim().is_empty() => {
            let mut words = runner.split_whitespace();
            let mut cmd = Command::new(words.next().unwrap());
            cmd.args(words).arg(bin);
            cmd
        }
        _ => Command::new(bin),
    }
}
