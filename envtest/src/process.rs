//! A child process that logs to a file and is killed when dropped.

use std::{
    fs,
    io::{BufRead, BufReader},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use crate::{Error, Result};

/// A running `etcd` or `kube-apiserver`.
///
/// Dropping it kills the process and reaps it, so that nothing outlives the
/// fleet that started it, including when a test panics.
#[derive(Debug)]
pub(crate) struct Process {
    what: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Starts `program` with `args`, appending stdout and stderr to `log`.
    pub(crate) fn spawn(
        what: String,
        program: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Self> {
        let open_log = || {
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(|e| Error::io(format!("opening log {} of {what}", log.display()), e))
        };
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(open_log()?)
            .stderr(open_log()?)
            .spawn()
            .map_err(|e| Error::io(format!("starting {what} ({})", program.display()), e))?;
        Ok(Self { what, child, log })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The error to report if the process has already exited.
    pub(crate) fn exit_error(&mut self) -> Option<Error> {
        let status = self.child.try_wait().ok().flatten()?;
        Some(Error::Exited {
            process: self.what.clone(),
            status,
            log: self.log.clone(),
            tail: log_tail(&self.log, 20),
        })
    }

    /// Whether the process failed because its port was taken in the meantime.
    pub(crate) fn lost_port_race(&self) -> bool {
        log_tail(&self.log, 40).contains("address already in use")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // An already reaped child makes `kill` fail; `wait` then returns at once.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `lines` lines of a log file, or a note that it could not be read.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(file) = fs::File::open(path) else {
        return format!("(log {} could not be read)", path.display());
    };
    let all: Vec<String> = BufReader::new(file).lines().map_while(Result::ok).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A port on 127.0.0.1 that was free a moment ago.
///
/// Another process may take it before ours binds it; callers retry with a new
/// port when [`Process::lost_port_race`] says so.
pub(crate) fn free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| Error::io("finding a free port on 127.0.0.1", e))
}
