//! A running controller's graceful stop: once asked, no new reconciles
//! start, and the runner ends when none runs or the timeout passes.

use std::{pin::Pin, task::Context, time::Duration};

use futures::{FutureExt, future::BoxFuture};
use tokio::time::Sleep;

/// The signal to stop, and the drain it starts.
pub(super) struct Stop {
    signal: BoxFuture<'static, ()>,
    timeout: Duration,
    draining: Option<Pin<Box<Sleep>>>,
}

/// Where a drain stands.
pub(super) enum Drain {
    /// No stop was asked for.
    Running,
    /// Asked for; reconciles still run and the timeout has not passed.
    Draining,
    /// Nothing runs any more.
    Done,
    /// The timeout passed with reconciles still running.
    TimedOut,
}

impl Stop {
    pub(super) fn new(signal: BoxFuture<'static, ()>, timeout: Duration) -> Self {
        Self {
            signal,
            timeout,
            draining: None,
        }
    }

    /// Whether the stop was asked for just now.
    pub(super) fn poll_asked(&mut self, cx: &mut Context<'_>) -> bool {
        if self.draining.is_none() && self.signal.poll_unpin(cx).is_ready() {
            self.draining = Some(Box::pin(tokio::time::sleep(self.timeout)));
            return true;
        }
        false
    }

    /// Where the drain stands with `running` reconciles left.
    pub(super) fn poll_drain(&mut self, cx: &mut Context<'_>, running: usize) -> Drain {
        let Some(deadline) = self.draining.as_mut() else {
            return Drain::Running;
        };
        if running == 0 {
            return Drain::Done;
        }
        if deadline.as_mut().poll(cx).is_ready() {
            return Drain::TimedOut;
        }
        Drain::Draining
    }
}
