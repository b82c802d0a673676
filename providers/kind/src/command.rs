//! Running `kind`: with a deadline, killed when no longer awaited, and never
//! blocking the runtime.

use std::{
    fmt,
    path::Path,
    process::{ExitStatus, Stdio},
    time::Duration,
};

use tokio::process::Command;

/// How long one `kind` command may run before it is killed.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(30);

/// The most of stderr's first line that a message quotes.
const MAX_QUOTED: usize = 300;

/// Why a `kind` command gave no answer.
///
/// Its display names the command and how it ended, and quotes at most the
/// first line of its stderr: never its stdout, which may be a kubeconfig
/// with keys in it.
#[derive(Debug)]
pub(crate) struct CommandError {
    command: String,
    failure: Failure,
}

#[derive(Debug)]
enum Failure {
    Spawn(std::io::Error),
    Exit {
        status: ExitStatus,
        first_line: String,
    },
    Timeout,
    NotUtf8,
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let command = &self.command;
        match &self.failure {
            Failure::Spawn(error) => write!(f, "`{command}` could not be run: {error}"),
            Failure::Exit { status, first_line } if first_line.is_empty() => {
                write!(f, "`{command}` failed ({status})")
            }
            Failure::Exit { status, first_line } => {
                write!(f, "`{command}` failed ({status}): {first_line}")
            }
            Failure::Timeout => write!(
                f,
                "`{command}` did not finish within {}s and was killed",
                TIMEOUT.as_secs()
            ),
            Failure::NotUtf8 => write!(f, "`{command}` printed output that is not UTF-8"),
        }
    }
}

/// Runs `executable` with `args` and returns what it printed on stdout, if
/// it exits with success within [`TIMEOUT`].
pub(crate) async fn run(executable: &Path, args: &[&str]) -> Result<String, CommandError> {
    let error = |failure| CommandError {
        command: format!("{} {}", executable.display(), args.join(" ")),
        failure,
    };
    let output = Command::new(executable)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A command that runs past its deadline, or whose stream is dropped,
        // is not left behind.
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(TIMEOUT, output).await {
        Ok(Ok(output)) => output,
        Ok(Err(spawn)) => return Err(error(Failure::Spawn(spawn))),
        Err(_elapsed) => return Err(error(Failure::Timeout)),
    };
    if !output.status.success() {
        return Err(error(Failure::Exit {
            status: output.status,
            first_line: first_line(&output.stderr),
        }));
    }
    String::from_utf8(output.stdout).map_err(|_| error(Failure::NotUtf8))
}

/// The first line of `stderr` with text on it, trimmed and cut short.
fn first_line(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty());
    let line = line.unwrap_or_default();
    match line.char_indices().nth(MAX_QUOTED) {
        Some((end, _)) => format!("{}...", &line[..end]),
        None => line.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_line_of_stderr_is_quoted() {
        assert_eq!(
            first_line(b"\n  ERROR: no docker \nsecond line\n"),
            "ERROR: no docker"
        );
        assert_eq!(first_line(b""), "");
        let long = "x".repeat(MAX_QUOTED + 10);
        assert_eq!(first_line(long.as_bytes()).len(), MAX_QUOTED + 3);
    }

    #[tokio::test]
    async fn a_missing_program_names_itself() {
        let error = run(Path::new("/nonexistent/kind"), &["get", "clusters"])
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("`/nonexistent/kind get clusters` could not be run: "),
            "{error}"
        );
    }
}
