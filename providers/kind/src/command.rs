//! Running `kind`: with a deadline, killed with what it started when no
//! longer awaited, and without blocking the runtime while it runs.

use std::{
    fmt,
    path::Path,
    process::{ExitStatus, Output, Stdio},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncReadExt},
    process::{Child, Command},
};

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
    Io(std::io::Error),
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
            Failure::Io(error) => write!(f, "`{command}` could not be read from: {error}"),
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
///
/// A command that runs past its deadline, or whose future is dropped, is
/// killed (`SIGKILL`). On unix it runs in a process group of its own, and
/// the whole group is killed, so that what `kind` started (a `docker exec`
/// that hangs) goes too; elsewhere only `kind` itself is.
pub(crate) async fn run(executable: &Path, args: &[&str]) -> Result<String, CommandError> {
    let error = |failure| CommandError {
        command: format!("{} {}", executable.display(), args.join(" ")),
        failure,
    };
    let mut command = Command::new(executable);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    #[cfg(unix)]
    command.process_group(0);
    let mut child = command
        .spawn()
        .map_err(|spawn| error(Failure::Spawn(spawn)))?;
    // Declared after `child`, so dropped before it: the group is killed
    // while `kind`, not yet reaped, still holds its id.
    let mut group = Group::of(&child);
    let output = tokio::time::timeout(TIMEOUT, output(&mut child)).await;
    if child.id().is_none() {
        // Reaped: its id may be reused already, and is not to be killed.
        group.disarm();
    }
    let output = match output {
        Ok(Ok(output)) => output,
        Ok(Err(io)) => return Err(error(Failure::Io(io))),
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

/// Reads `child`'s stdout and stderr to their ends, then waits for it: it
/// is reaped last, so that until then its process group can be killed.
async fn output(child: &mut Child) -> std::io::Result<Output> {
    async fn read_all(pipe: Option<impl AsyncRead + Unpin>) -> std::io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            pipe.read_to_end(&mut bytes).await?;
        }
        Ok(bytes)
    }
    let (stdout, stderr) =
        futures::future::try_join(read_all(child.stdout.take()), read_all(child.stderr.take()))
            .await?;
    let status = child.wait().await?;
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// The process group of a `kind` command: killed on drop unless disarmed.
struct Group {
    #[cfg_attr(not(unix), allow(dead_code))]
    id: Option<u32>,
}

impl Group {
    fn of(child: &Child) -> Self {
        Self { id: child.id() }
    }

    fn disarm(&mut self) {
        self.id = None;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // There is no `killpg` without unsafe code or another dependency:
        // `kill` does it. If it cannot be run, `kill_on_drop` still kills
        // `kind`, and only what it started is left to end by itself.
        // `kill` is waited for here, a few milliseconds on the thread that
        // drops the command, so that the group is gone before `kind` is
        // reaped and its id can be reused.
        #[cfg(unix)]
        if let Some(id) = self.id.take() {
            let killed = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{id}")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if !killed.is_ok_and(|status| status.success()) {
                tracing::debug!(
                    group = id,
                    "could not kill the process group of a kind command"
                );
            }
        }
    }
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
