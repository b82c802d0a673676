//! The test process's open-file limit.
//!
//! Every connection a test makes to a cluster passes through the fleet's
//! fault proxy, which runs in the test process: one connection costs three
//! descriptors there. A fleet of ten clusters with a few controllers needs a
//! few hundred, more than macOS's default soft limit of 256 and close to the
//! 1,024 of many Linux shells once a test binary runs its tests in parallel.

use std::sync::Once;

/// Raises the soft limit on open files to the hard limit, once per process.
///
/// Go programs (kube-apiserver and etcd among them) do the same when they
/// start; a limit the user set below the hard one on purpose is raised too,
/// which a fleet of test API servers has no reason to respect.
pub(crate) fn raise_limit() {
    static RAISED: Once = Once::new();
    RAISED.call_once(raise);
}

#[cfg(unix)]
#[allow(unsafe_code)]
fn raise() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write only the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 || limit.rlim_cur >= limit.rlim_max
        {
            return;
        }
        limit.rlim_cur = limit.rlim_max;
        // macOS refuses more than OPEN_MAX for an unlimited hard limit.
        #[cfg(target_os = "macos")]
        {
            limit.rlim_cur = limit.rlim_cur.min(libc::OPEN_MAX as libc::rlim_t);
        }
        // On failure the limit stays as it was; an error that runs out of
        // descriptors then says so (`explain`).
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
}

#[cfg(not(unix))]
fn raise() {}

/// A note for an error that ran out of file descriptors: how many this
/// process has open and what its limit is, so the reader can tell a leak
/// from a low limit. Empty for any other error.
pub(crate) fn explain(error: &std::io::Error) -> String {
    #[cfg(unix)]
    if error.raw_os_error() == Some(libc::EMFILE) {
        let open = std::fs::read_dir("/proc/self/fd")
            .map(|entries| entries.count().to_string())
            .unwrap_or_else(|_| "an unknown number of".to_owned());
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes only the struct passed.
        #[allow(unsafe_code)]
        let known = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
        let limit = if known {
            format!(
                "soft limit {}, hard limit {}",
                limit.rlim_cur, limit.rlim_max
            )
        } else {
            "limit unknown".to_owned()
        };
        return format!(" (this process has {open} files open; {limit})");
    }
    let _ = error;
    String::new()
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[allow(unsafe_code)]
    fn limit() -> libc::rlimit {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes only the struct passed.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        limit
    }

    #[test]
    #[allow(unsafe_code)]
    fn a_soft_limit_below_the_hard_one_is_raised() {
        let mut lowered = limit();
        lowered.rlim_cur = lowered.rlim_max.min(256);
        // SAFETY: setrlimit reads only the struct passed.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
        raise();
        let raised = limit();
        assert!(
            raised.rlim_cur > 256 || raised.rlim_max <= 256,
            "{}",
            raised.rlim_cur
        );
    }

    #[test]
    fn running_out_of_descriptors_is_explained_with_the_count_and_the_limit() {
        let error = std::io::Error::from_raw_os_error(libc::EMFILE);
        let note = explain(&error);
        assert!(
            note.contains("files open") && note.contains("soft limit"),
            "{note}"
        );
        assert_eq!(explain(&std::io::Error::other("other")), "");
    }
}
