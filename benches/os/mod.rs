//! What the OS says of a process, for the benchmarks: memory from
//! `/proc/self/status`, CPU time from `/proc/<pid>/stat`.

#![allow(dead_code)]

/// Clock ticks per second in `/proc/<pid>/stat` (USER_HZ, 100 on Linux).
const TICKS: f64 = 100.0;

/// A field of `/proc/self/status` given in kB (`VmRSS:`, `VmHWM:`), in KiB.
pub(crate) fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// This process's resident memory, in bytes.
pub(crate) fn resident_bytes() -> u64 {
    status_kib("VmRSS:") * 1024
}

/// Resets this process's peak resident memory (`VmHWM`) to its current one.
pub(crate) fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// User and system CPU seconds of process `pid` (or `"self"`) so far.
pub(crate) fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    (ticks(11) + ticks(12)) / TICKS
}

/// How many sockets this process has open (TCP connections and listeners,
/// Unix sockets), from the links in `/proc/self/fd`.
pub(crate) fn open_sockets() -> usize {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}
