//! CPU time and memory of a process from `/proc` (Linux): what the gateway spends per request.

use std::fs;

/// `USER_HZ`: the unit of `utime`/`stime` in `/proc/<pid>/stat`. It is 100 on every Linux ABI
/// we run on (the kernel exports it as a constant to userspace, independent of `CONFIG_HZ`).
const CLOCK_TICKS_PER_SEC: u64 = 100;

/// User + system CPU time of `pid` (all threads, living and exited), in µs. `None` when the
/// process is gone.
pub fn cpu_us(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields restart after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // After the name, field 3 (state) is index 0, so utime (14) is 11 and stime (15) is 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) * 1_000_000 / CLOCK_TICKS_PER_SEC)
}

/// CPU time of this process, in µs.
pub fn self_cpu_us() -> Option<u64> {
    cpu_us(std::process::id())
}

/// CPU time of the calling thread in ns, when `/proc/thread-self/schedstat` exists.
pub fn thread_cpu_ns() -> Option<u64> {
    let s = fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Memory facts from `/proc/<pid>/status`, in KiB.
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory {
    /// Resident set now.
    pub rss_kb: u64,
    /// Peak resident set since start or the last [`reset_peak`].
    pub hwm_kb: u64,
}

pub fn memory(pid: u32) -> Option<Memory> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line[name.len()..]
            .split_ascii_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some(Memory {
        rss_kb: field("VmRSS:")?,
        hwm_kb: field("VmHWM:")?,
    })
}

/// Resets the peak RSS (`VmHWM`) of `pid` to its current RSS, so each scenario reports its own
/// peak. Returns false when the kernel refuses (then the peak covers the whole process life).
pub fn reset_peak(pid: u32) -> bool {
    fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_has_cpu_time_and_memory() {
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(self_cpu_us().is_some());
        let m = memory(std::process::id()).expect("own status");
        assert!(m.rss_kb > 0 && m.hwm_kb >= m.rss_kb);
    }
}
