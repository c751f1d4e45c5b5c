//! The I/O priority of entry-log reads (issue 11, invariant 8): a read that
//! misses both caches goes to the disk, and a catch-up reader doing that
//! continuously competes with the journal's `fdatasync`s on the same device.
//! With [`ReadIoClass::Idle`] the thread doing such a read runs it in the
//! kernel's idle I/O class (`ioprio_set(2)`), so the block-layer scheduler
//! dispatches pending journal and flush writes first.
//!
//! Promises:
//! - only the calling thread's priority changes, and only for the life of the
//!   [`ReadPriority`] guard: the previous priority is restored on drop, so a
//!   pooled thread (`spawn_blocking`) that later flushes entry logs does so at
//!   its normal priority;
//! - a failure to change the priority (another OS, a kernel without the
//!   syscall) never fails the read: it runs at the normal priority;
//! - the effect depends on the device's scheduler: `mq-deadline` (the usual
//!   default for SATA and virtio disks) and `bfq` honour I/O classes; `none`
//!   (typical for NVMe) and `kyber` ignore them. mq-deadline serves an idle
//!   request at the latest after `prio_aging_expire` (10 s by default), so a
//!   steady stream of writes delays reads but never starves them.
//!
//! We call the syscall directly: `nix` has no wrapper, `libc` has only the
//! number, and the `ioprio` crate is unmaintained (it pins nix 0.21).

/// The I/O class entry-log reads run in (bookie flag `--read-io-class`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum ReadIoClass {
    /// The thread's own priority (normally best effort, level 4).
    Normal,
    /// The idle class: served when no other class has requests pending.
    #[default]
    Idle,
}

/// `IOPRIO_WHO_PROCESS` with who = 0: the calling thread.
const WHO_THREAD: libc::c_long = 1;
/// `IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT` (class 3, shift 13).
const IDLE: libc::c_long = 3 << 13;

#[allow(unsafe_code, reason = "ioprio_get has no safe wrapper (module doc)")]
fn get() -> Option<libc::c_long> {
    // SAFETY: ioprio_get takes two integers and touches no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_get, WHO_THREAD, 0 as libc::c_long) };
    (r >= 0).then_some(r)
}

#[allow(unsafe_code, reason = "ioprio_set has no safe wrapper (module doc)")]
fn set(prio: libc::c_long) -> bool {
    // SAFETY: ioprio_set takes three integers and touches no memory of ours;
    // lowering one's own priority needs no privilege, and restoring a value
    // the thread had before is always allowed for the idle and best-effort
    // classes.
    unsafe { libc::syscall(libc::SYS_ioprio_set, WHO_THREAD, 0 as libc::c_long, prio) == 0 }
}

/// Runs the calling thread's I/O in `class` until dropped.
#[must_use = "the priority is restored when the guard drops"]
pub struct ReadPriority {
    restore: Option<libc::c_long>,
}

impl ReadPriority {
    /// Lowers the calling thread's I/O priority to `class` (no-op for
    /// [`ReadIoClass::Normal`] or where the syscall fails).
    pub fn enter(class: ReadIoClass) -> Self {
        let restore = match class {
            ReadIoClass::Normal => None,
            ReadIoClass::Idle => get().filter(|&old| old != IDLE && set(IDLE)),
        };
        Self { restore }
    }

    /// Whether the priority was changed (and will be restored).
    #[cfg(test)]
    fn changed(&self) -> bool {
        self.restore.is_some()
    }
}

impl Drop for ReadPriority {
    fn drop(&mut self) {
        if let Some(old) = self.restore {
            set(old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_is_the_default() {
        assert_eq!(ReadIoClass::default(), ReadIoClass::Idle);
    }

    #[test]
    fn idle_lasts_for_the_guard_and_the_old_priority_comes_back() {
        // A fresh thread, so no other test's guard is in play.
        std::thread::spawn(|| {
            let Some(before) = get() else {
                return; // no ioprio syscalls here: nothing to check
            };
            {
                let g = ReadPriority::enter(ReadIoClass::Idle);
                assert!(g.changed());
                assert_eq!(get(), Some(IDLE));
                // Nested: already idle, nothing to change or restore.
                let inner = ReadPriority::enter(ReadIoClass::Idle);
                assert!(!inner.changed());
                drop(inner);
                assert_eq!(get(), Some(IDLE));
            }
            assert_eq!(get(), Some(before));
            let n = ReadPriority::enter(ReadIoClass::Normal);
            assert!(!n.changed());
            assert_eq!(get(), Some(before));
        })
        .join()
        .unwrap();
    }
}
