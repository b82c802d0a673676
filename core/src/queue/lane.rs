//! The lanes a cluster's ready keys wait in, and which is served first.

/// Which lane of its cluster a ready key waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// A change seen while the watch ran, a due requeue or retry, or a
    /// request from outside.
    Changed,
    /// An object listed when a watch (re)started.
    Listed,
    /// A change that only echoes the controller's own write: served once
    /// the other two lanes are empty, or after [`ECHO_EVERY`](super::lanes::ECHO_EVERY) keys from
    /// them.
    Echoed,
}

impl Lane {
    fn rank(self) -> u8 {
        match self {
            Lane::Changed => 2,
            Lane::Listed => 1,
            Lane::Echoed => 0,
        }
    }

    /// Whether a key in `self` is served before one in `other`.
    pub(super) fn outranks(self, other: Lane) -> bool {
        self.rank() > other.rank()
    }

    pub(super) fn max(self, other: Lane) -> Lane {
        if other.outranks(self) { other } else { self }
    }
}
