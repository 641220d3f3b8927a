//! The one format every parent↔child pipe of sealnode speaks: a fixed 13-byte [`Frame`],
//! either `Ok(value)` (a pid, a count), `Reached(step)` (a step about to be made: a setup
//! killed without a word is then told at its step) or `Failed { step, item, errno }` for a
//! setup step that failed. Each setup sequence names its steps with its own enum implementing [`Step`] (the
//! role child's [`Stage`](super::Stage), the cell init's `cell::Step`, the intermediate that
//! enters a cell), so the parent turns a frame back into a named step, never a bare number.
//!
//! The child side is [`fail`]/[`must`]: write the frame, exit [`exit::CONFIG`]. The parent side
//! is [`read_frame`] (a pipe whose EOF after `Reached` of the exec means "exec happened", and
//! before it that the child was killed) or [`Frame::decode`] (a message
//! received with fds). [`FORWARDED`] is the set of signals a parent passes on to its child's
//! init, and [`Reap`] kills and reaps a child whose setup the parent abandons.

use std::os::fd::RawFd;

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use crate::error::Error;
use crate::exit;
use crate::os::sys;

/// Signals the launcher passes on to a sandbox's init, and the init on to its workload.
pub const FORWARDED: [Signal; 6] =
    [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGUSR1, Signal::SIGUSR2];

/// A named step of a setup sequence.
pub trait Step: Copy + PartialEq + std::fmt::Debug + 'static {
    /// Every step, in execution order.
    const ALL: &'static [Self];
    /// The name errors and docs use.
    fn name(self) -> &'static str;
    /// The step's code on the wire: its position in [`Step::ALL`], from 1.
    fn code(self) -> u32 {
        Self::ALL.iter().position(|s| *s == self).map(|i| i as u32 + 1).unwrap_or(0)
    }
    fn from_code(code: u32) -> Option<Self> {
        code.checked_sub(1).and_then(|i| Self::ALL.get(i as usize)).copied()
    }
}

/// What a child tells its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// Success, with a value (a pid, or 0).
    Ok(u32),
    /// The child is about to make the step with this code: the last one said is where a child
    /// that died without a word was killed.
    Reached(u32),
    /// The step with this code is made (the sandbox init's confinement, which the parent waits
    /// for besides the workload's exec).
    Done(u32),
    /// A step failed: its code, the index of the failing item (mount, rlimit, rule, listener),
    /// and the errno.
    Failed { step: u32, item: u32, errno: i32 },
}

impl Frame {
    pub const SIZE: usize = 13;

    pub fn encode(self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        let (tag, a, c, e) = match self {
            Frame::Ok(v) => (0u8, v, 0u32, 0i32),
            Frame::Failed { step, item, errno } => (1u8, step, item, errno),
            Frame::Reached(step) => (2u8, step, 0, 0),
            Frame::Done(step) => (3u8, step, 0, 0),
        };
        b[0] = tag;
        b[1..5].copy_from_slice(&a.to_ne_bytes());
        b[5..9].copy_from_slice(&c.to_ne_bytes());
        b[9..13].copy_from_slice(&e.to_ne_bytes());
        b
    }

    /// A frame from exactly [`Frame::SIZE`] bytes; anything else is not a frame.
    pub fn decode(b: &[u8]) -> Option<Frame> {
        if b.len() != Self::SIZE {
            return None;
        }
        let w = |i: usize| [b[i], b[i + 1], b[i + 2], b[i + 3]];
        match b[0] {
            0 => Some(Frame::Ok(u32::from_ne_bytes(w(1)))),
            1 => Some(Frame::Failed {
                step: u32::from_ne_bytes(w(1)),
                item: u32::from_ne_bytes(w(5)),
                errno: i32::from_ne_bytes(w(9)),
            }),
            2 => Some(Frame::Reached(u32::from_ne_bytes(w(1)))),
            3 => Some(Frame::Done(u32::from_ne_bytes(w(1)))),
            _ => None,
        }
    }

    /// The failure this frame reports, in `S`'s terms; `None` for `Ok`, `Reached` and `Done`. A step
    /// code `S` does not know is a protocol error, never a guess.
    pub fn failure<S: Step>(self) -> Option<std::result::Result<Failure<S>, Errno>> {
        match self {
            Frame::Ok(_) | Frame::Reached(_) | Frame::Done(_) => None,
            Frame::Failed { step, item, errno } => Some(
                S::from_code(step)
                    .map(|step| Failure { step, item: item as usize, errno: Errno::from_raw(errno) })
                    .ok_or(Errno::EPROTO),
            ),
        }
    }
}

/// A failed step, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure<S> {
    pub step: S,
    pub item: usize,
    pub errno: Errno,
}

/// Send one frame (a pipe or a SOCK_SEQPACKET socket).
pub fn send(fd: RawFd, frame: Frame) -> std::result::Result<(), Errno> {
    sys::write_all(fd, &frame.encode())
}

/// Child side: report `step` as failed and exit [`exit::CONFIG`].
pub fn fail<S: Step>(fd: RawFd, step: S, item: usize, errno: Errno) -> ! {
    let _ = send(fd, Frame::Failed { step: step.code(), item: item as u32, errno: errno as i32 });
    sys::exit_now(exit::CONFIG)
}

/// Child side: say that `step` is about to be made, then make it with [`must`]: a child
/// killed during the step (a filter above sealnode killing its call, the OOM killer) is told
/// at that step, not taken for a workload that exec'd and exited.
pub fn step<S: Step, T>(fd: RawFd, step: S, item: usize, op: impl FnOnce() -> std::result::Result<T, Errno>) -> T {
    reached(fd, step, item);
    must(fd, step, item, op())
}

/// Child side: say that `step` is about to be made (or exit, as [`must`] does, when the parent
/// cannot be told): once per step, not again for each of its items (a root's ~40 mounts): the
/// parent keeps only the step, and the pipe's buffer holds every frame of a setup unread.
pub fn reached<S: Step>(fd: RawFd, step: S, item: usize) {
    use std::sync::atomic::{AtomicU32, Ordering};
    // The last step said by this process (each process of a setup is single-threaded; a fork
    // copies it, and the init's own step differs from any its child said).
    static SAID: AtomicU32 = AtomicU32::new(u32::MAX);
    let code = step.code();
    if SAID.swap(code, Ordering::Relaxed) != code {
        must(fd, step, item, send(fd, Frame::Reached(step.code())));
    }
}

/// Child side: the value, or report `step` as failed and exit.
pub fn must<S: Step, T>(fd: RawFd, step: S, item: usize, r: std::result::Result<T, Errno>) -> T {
    r.unwrap_or_else(|e| fail(fd, step, item, e))
}

/// Parent side of a pipe: the next frame the child wrote, or `None` at EOF before any byte
/// (the pipe is CLOEXEC: EOF means the child exec'd, or exited without a word). A partial
/// frame is EPROTO.
pub fn read_frame(fd: RawFd) -> std::result::Result<Option<Frame>, Errno> {
    let mut buf = [0u8; Frame::SIZE];
    let mut got = 0;
    while got < buf.len() {
        match sys::read_retry(fd, &mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    match got {
        0 => Ok(None),
        _ => Frame::decode(&buf[..got]).map(Some).ok_or(Errno::EPROTO),
    }
}

/// The fix told for a setup process killed without a word: who may have killed it.
pub const KILLED_FIX: &str = "a seccomp filter above sealnode kills one of its calls (SIGSYS), or something outside \
                              sealnode killed it: `sealnode doctor` tries them";

/// A child the parent is still setting up: [`Reap::abort`] kills and reaps it on the way out
/// of an error, so no half-set-up process outlives a failed start.
#[derive(Debug, Clone, Copy)]
pub struct Reap(pub Pid);

impl Reap {
    pub fn abort(self, e: Error) -> Error {
        let _ = kill(self.0, Signal::SIGKILL);
        let _ = waitpid(self.0, None);
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum T {
        A,
        B,
    }
    impl Step for T {
        const ALL: &'static [T] = &[T::A, T::B];
        fn name(self) -> &'static str {
            match self {
                T::A => "a",
                T::B => "b",
            }
        }
    }

    #[test]
    fn frames_round_trip_and_name_their_step() {
        for f in [
            Frame::Ok(0),
            Frame::Ok(4_000_000),
            Frame::Failed { step: 2, item: 7, errno: libc::EACCES },
            Frame::Reached(2),
            Frame::Done(1),
        ] {
            assert_eq!(Frame::decode(&f.encode()), Some(f));
        }
        let f = Frame::Failed { step: T::B.code(), item: 3, errno: libc::EPERM };
        assert_eq!(f.failure::<T>(), Some(Ok(Failure { step: T::B, item: 3, errno: Errno::EPERM })));
        assert_eq!(Frame::Ok(9).failure::<T>(), None);
        assert_eq!(Frame::Reached(T::A.code()).failure::<T>(), None);
        // A code no step has, a short frame and an unknown tag are not guessed at.
        assert_eq!(Frame::Failed { step: 3, item: 0, errno: 1 }.failure::<T>(), Some(Err(Errno::EPROTO)));
        assert_eq!(Frame::Failed { step: 0, item: 0, errno: 1 }.failure::<T>(), Some(Err(Errno::EPROTO)));
        assert_eq!(Frame::decode(&[0u8; 12]), None);
        let mut b = Frame::Ok(1).encode();
        b[0] = 4;
        assert_eq!(Frame::decode(&b), None);
        assert_eq!((T::A.code(), T::B.code()), (1, 2));
    }

    #[test]
    fn read_frame_tells_eof_from_a_frame_from_a_partial_one() {
        let (r, w) = nix::unistd::pipe().expect("pipe");
        drop(w);
        assert_eq!(read_frame(std::os::fd::AsRawFd::as_raw_fd(&r)), Ok(None));
        let (r, w) = nix::unistd::pipe().expect("pipe");
        send(std::os::fd::AsRawFd::as_raw_fd(&w), Frame::Ok(42)).expect("send");
        drop(w);
        assert_eq!(read_frame(std::os::fd::AsRawFd::as_raw_fd(&r)), Ok(Some(Frame::Ok(42))));
        let (r, w) = nix::unistd::pipe().expect("pipe");
        sys::write_all(std::os::fd::AsRawFd::as_raw_fd(&w), &[1, 2, 3]).expect("write");
        drop(w);
        assert_eq!(read_frame(std::os::fd::AsRawFd::as_raw_fd(&r)), Err(Errno::EPROTO));
    }
}
