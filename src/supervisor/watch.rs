//! `cell.reload_on_change`, as a component of the event loop: the config file's directory
//! watched with inotify (under [`TOKEN_WATCH`]), so that a change of the config reloads the
//! cell as a SIGHUP does, once the changes have settled for [`SETTLE`]. What counts as a
//! change of the config ([`Seen::of`], unit-tested as a table): kubelet's swap of a ConfigMap
//! volume (`..data` renamed over, in the directory that holds the config's link), a rename over
//! the file (config management's atomic write), the file created or rewritten in place; and
//! the directory itself gone, moved or unmounted, a symlink on the way to it renamed over or
//! made anew (the directory each is in is watched too), or events lost, the queue's overflow
//! included (the watch is armed again).
//! It offers `handle` (events to read), a next deadline and `due`; the supervisor's
//! `on_config_change` (sighup.rs) takes SIGHUP's path from there, and asks it to `wait` while
//! the cell is busy: a change is then reloaded once the cell is not, never dropped.
//!
//! The watch is only a trigger: what a reload reads is the config read again through the
//! checked walk (os::trusted), never anything named by an event.

use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

use crate::config::Config;

pub(super) const TOKEN_WATCH: u64 = 11 << 56;

/// How long the config's directory must be quiet before a change is reloaded (and how often a
/// change waiting for a busy cell asks again): kubelet's swap is several events (`..data_tmp`
/// made, renamed over `..data`, the old dir removed), an editor's save a few.
pub(super) const SETTLE: Duration = Duration::from_secs(1);

/// The link kubelet renames over in a ConfigMap volume's directory at every update.
const KUBELET_DATA: &str = "..data";

/// What is watched in the config's directory: a name's content appearing or changing there,
/// and the directory itself going away.
fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

/// What one inotify event says about the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    /// Nothing about the config (another name in the directory, or one going away).
    Other,
    /// The config, or `..data`, has new content.
    Change,
    /// The watch may no longer see the config's directory (it was removed, moved or
    /// unmounted, the watch dropped, or events were lost): a change, and the watch is armed
    /// again on the path.
    Lost,
}

impl Seen {
    /// The event `mask` on `name` (in the watched directory), for a config named `file` there.
    pub(super) fn of(mask: AddWatchFlags, name: Option<&OsStr>, file: &OsStr) -> Seen {
        let lost = AddWatchFlags::IN_Q_OVERFLOW
            | AddWatchFlags::IN_IGNORED
            | AddWatchFlags::IN_UNMOUNT
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF;
        if mask.intersects(lost) {
            return Seen::Lost;
        }
        let content = AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MODIFY;
        match name {
            Some(n) if (n == file || n == KUBELET_DATA) && mask.intersects(content) => Seen::Change,
            _ => Seen::Other,
        }
    }

    /// Whether the event `mask` on `name`, in the directory a symlink `link` on the way to the
    /// config's directory is in, may have changed where the link leads (or the directory went).
    pub(super) fn of_link(mask: AddWatchFlags, name: Option<&OsStr>, link: &OsStr) -> bool {
        let gone = AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF | AddWatchFlags::IN_UNMOUNT;
        let made = AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_CREATE;
        mask.intersects(gone) || (name == Some(link) && mask.intersects(made))
    }
}

/// The armed watch: the inotify instance (in the loop's epoll set), its watch of the config's
/// directory, and one of the directory each symlink on the way to it is in (with the link's
/// name): a link renamed over there (a release's `current -> rel2`) leads to another directory.
#[derive(Debug)]
struct Armed {
    inotify: Inotify,
    wd: Option<WatchDescriptor>,
    links: Vec<(WatchDescriptor, OsString)>,
    dir: PathBuf,
    file: OsString,
}

#[derive(Debug, Default)]
pub(super) struct ConfigWatch {
    armed: Option<Armed>,
    /// A change was seen: it is reloaded at this time (each later change puts it back).
    due: Option<Instant>,
    /// The change waits for a busy cell (said once).
    waiting: bool,
    /// The directory could not be watched (gone, replaced, unreadable): tried again then.
    retry: Option<Instant>,
}

/// How often a directory that cannot be watched is tried again.
pub(super) const RETRY: Duration = Duration::from_secs(5);

impl ConfigWatch {
    /// Watch `cfg`'s file when `cell.reload_on_change` says so, and stop watching when it no
    /// longer does (at start, and when a reload's config comes into force). A directory that
    /// cannot be watched is said, and the cell runs on (SIGHUP still reloads).
    pub(super) fn follow(&mut self, cfg: &Config, epoll: &Epoll) {
        let want = cfg.cell.reload_on_change.then(|| split(&cfg.file)).flatten();
        let same = matches!((&self.armed, &want), (Some(a), Some((d, f))) if a.dir == *d && a.file == *f);
        if same {
            self.rearm(Instant::now());
            return;
        }
        if let Some(a) = self.armed.take() {
            // Closing the instance drops its watch and its place in the epoll set.
            let _ = epoll.delete(a.inotify.as_fd());
            tracing::info!(dir = %a.dir.display(), "config watch stopped (cell.reload_on_change is off)");
        }
        self.due = None;
        self.waiting = false;
        let Some((dir, file)) = want else { return };
        let inotify = match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(i) => i,
            Err(e) => {
                return tracing::warn!(error = %e, "cannot watch the config (inotify_init1); a change will not reload the cell, SIGHUP does")
            }
        };
        if let Err(e) = epoll.add(inotify.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_WATCH)) {
            return tracing::warn!(error = %e, "cannot watch the config (epoll_ctl); a change will not reload the cell, SIGHUP does");
        }
        let mut a = Armed { inotify, wd: None, links: Vec::new(), dir, file };
        a.arm();
        if a.wd.is_some() {
            tracing::info!(dir = %a.dir.display(), file = %a.file.to_string_lossy(), "watching the config: a change reloads the cell (cell.reload_on_change)");
        }
        self.retry = a.wd.is_none().then(|| Instant::now() + RETRY);
        self.armed = Some(a);
    }

    /// Arm the watch again (the directory's path may name another directory now); one that
    /// cannot be watched is tried again in [`RETRY`]. True when it was unwatched and is
    /// watched now: what changed meanwhile was not seen, so the caller takes it as a change.
    fn rearm(&mut self, now: Instant) -> bool {
        let Some(a) = &mut self.armed else { return false };
        let was = a.wd.is_some();
        a.arm();
        self.retry = a.wd.is_none().then(|| now + RETRY);
        if !was && a.wd.is_some() {
            tracing::info!(dir = %a.dir.display(), "the config's directory is watched again; its contents are taken as a change");
            return true;
        }
        false
    }

    /// The inotify fd is readable: every event read; a change of the config is due
    /// [`SETTLE`] after the last one.
    pub(super) fn handle(&mut self, now: Instant) {
        let Some(a) = &mut self.armed else { return };
        let mut changed = false;
        let mut lost = false;
        loop {
            match a.inotify.read_events() {
                Ok(events) if !events.is_empty() => {
                    for ev in events {
                        // The queue overflowed: its event has no watch (wd -1), and what was
                        // dropped may have been the config's (found by review: it was ignored).
                        if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                            lost = true;
                        }
                        // A link on the way renamed over or made anew, or its directory gone.
                        if a.links
                            .iter()
                            .any(|(wd, name)| *wd == ev.wd && Seen::of_link(ev.mask, ev.name.as_deref(), name))
                        {
                            lost = true;
                        }
                        // Events of a watch dropped for a newer one (its IN_IGNORED) are not news.
                        if Some(ev.wd) != a.wd {
                            continue;
                        }
                        match Seen::of(ev.mask, ev.name.as_deref(), &a.file) {
                            Seen::Change => changed = true,
                            Seen::Lost => lost = true,
                            Seen::Other => {}
                        }
                    }
                }
                Ok(_) | Err(Errno::EAGAIN) => break,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the config watch failed; armed again");
                    lost = true;
                    break;
                }
            }
        }
        if lost {
            self.rearm(now);
        }
        if changed || lost {
            tracing::debug!(lost, "config change seen; reloading once it settles");
            self.due = Some(now + SETTLE);
        }
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        [self.due, self.retry].into_iter().flatten().min()
    }

    /// A change has settled: it is the caller's now (the watch armed again first, so the next
    /// change is seen whatever became of the directory).
    pub(super) fn due(&mut self, now: Instant) -> bool {
        if self.retry.is_some_and(|t| t <= now) && self.rearm(now) {
            // Watched again after a gap: whatever changed in it is a change, once quiet.
            self.due = Some(now + SETTLE);
        }
        if self.due.is_none_or(|t| t > now) {
            return false;
        }
        self.due = None;
        self.rearm(now);
        true
    }

    /// The cell is busy with `what`: the change is asked again in [`SETTLE`]. True the first
    /// time for this change (the caller says so once).
    pub(super) fn wait(&mut self, now: Instant) -> bool {
        self.due = Some(now + SETTLE);
        !std::mem::replace(&mut self.waiting, true)
    }

    /// The change was taken (reloaded, refused or found the same): the next one is new.
    pub(super) fn taken(&mut self) {
        self.waiting = false;
    }
}

impl Armed {
    /// (Re)add the watch on the directory's path: the same directory keeps its watch; one
    /// put in its place gets a new watch and the old is dropped. A directory that cannot be
    /// watched now is said; the next change seen, or the next reload, tries again.
    fn arm(&mut self) {
        // One mask for every watch: a directory watched twice (a link's and the config's) has
        // one watch, whose mask the second add would replace.
        let before: Vec<WatchDescriptor> = self.wd.iter().copied().chain(self.links.iter().map(|l| l.0)).collect();
        match self.inotify.add_watch(&self.dir, mask()) {
            Ok(wd) => self.wd = Some(wd),
            Err(e) => {
                self.wd = None;
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot watch the config's directory; a change will not reload the cell until it can be watched (SIGHUP does)");
            }
        }
        // A link's directory that cannot be watched leaves that link unfollowed (said); the
        // config's own directory is still watched.
        self.links = links_on_the_way(&self.dir)
            .into_iter()
            .filter_map(|(at, name)| match self.inotify.add_watch(&at, mask()) {
                Ok(wd) => Some((wd, name)),
                Err(e) => {
                    tracing::warn!(dir = %at.display(), link = %name.to_string_lossy(), error = %e, "cannot watch the directory of a link on the way to the config; a new target of that link reloads nothing until SIGHUP");
                    None
                }
            })
            .collect();
        for old in before {
            if self.wd != Some(old) && !self.links.iter().any(|l| l.0 == old) {
                let _ = self.inotify.rm_watch(old);
            }
        }
    }
}

/// Every symlink met on the way to `dir` (links in links' targets too), as the directory it is
/// in and its name, in the order they are met; at most 40, as the kernel follows.
fn links_on_the_way(dir: &Path) -> Vec<(PathBuf, OsString)> {
    use std::collections::VecDeque;
    use std::path::Component;
    fn names(p: &Path) -> impl DoubleEndedIterator<Item = OsString> + '_ {
        p.components().filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
    }
    let mut found = Vec::new();
    let mut at = PathBuf::from("/");
    let mut rest: VecDeque<OsString> = names(dir).collect();
    while let Some(name) = rest.pop_front() {
        if name == ".." {
            at.pop();
            continue;
        }
        let here = at.join(&name);
        match std::fs::read_link(&here) {
            Ok(target) if found.len() < 40 => {
                found.push((at.clone(), name));
                if target.is_absolute() {
                    at = PathBuf::from("/");
                }
                names(&target).rev().for_each(|n| rest.push_front(n));
            }
            _ => at = here,
        }
    }
    found
}

/// The config's directory and its name there.
fn split(file: &Path) -> Option<(PathBuf, OsString)> {
    Some((file.parent()?.to_path_buf(), file.file_name()?.to_os_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which events are the config's, for a config named sealnode.toml: (mask, name, seen).
    #[test]
    fn what_counts_as_a_change_of_the_config() {
        use AddWatchFlags as F;
        let file = OsStr::new("sealnode.toml");
        let cases: &[(AddWatchFlags, Option<&str>, Seen)] = &[
            // kubelet's swap: ..data_tmp made (another name), renamed over ..data.
            (F::IN_CREATE, Some("..data_tmp"), Seen::Other),
            (F::IN_MOVED_TO, Some("..data"), Seen::Change),
            (F::IN_CREATE | F::IN_ISDIR, Some("..2026_12_03_10_00_00.1"), Seen::Other),
            // A rename over the file, a new file, a rewrite in place.
            (F::IN_MOVED_TO, Some("sealnode.toml"), Seen::Change),
            (F::IN_CREATE, Some("sealnode.toml"), Seen::Change),
            (F::IN_MODIFY, Some("sealnode.toml"), Seen::Change),
            (F::IN_CLOSE_WRITE, Some("sealnode.toml"), Seen::Change),
            // Another file, an editor's backup.
            (F::IN_CLOSE_WRITE, Some("node.json"), Seen::Other),
            (F::IN_MOVED_TO, Some("sealnode.toml~"), Seen::Other),
            (F::IN_CLOSE_WRITE, Some(".sealnode.toml.swp"), Seen::Other),
            // The directory itself, or the events, lost.
            (F::IN_DELETE_SELF, None, Seen::Lost),
            (F::IN_MOVE_SELF, None, Seen::Lost),
            (F::IN_IGNORED, None, Seen::Lost),
            (F::IN_UNMOUNT, None, Seen::Lost),
            (F::IN_Q_OVERFLOW, None, Seen::Lost),
        ];
        for (mask, name, want) in cases {
            assert_eq!(Seen::of(*mask, name.map(OsStr::new), file), *want, "{mask:?} {name:?}");
        }
    }

    /// An armed watch of `file`'s directory, as `follow` makes it, in `epoll`.
    fn armed(file: &Path, epoll: &Epoll) -> ConfigWatch {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).expect("inotify");
        epoll.add(inotify.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_WATCH)).expect("epoll");
        let (dir, name) = split(file).expect("split");
        let mut a = Armed { inotify, wd: None, links: Vec::new(), dir, file: name };
        a.arm();
        assert!(a.wd.is_some());
        ConfigWatch { armed: Some(a), ..Default::default() }
    }

    /// Found by review: the queue's overflow (its event has no watch) was dropped with the
    /// events of old watches, so a config changed while the queue was full reloaded nothing.
    #[test]
    fn an_overflowed_queue_is_taken_as_a_change() {
        let max: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(16384);
        assert!(max <= 1 << 20, "max_queued_events {max}: too many events to make in a test");
        let d = tempfile::tempdir().expect("tmp");
        let file = d.path().join("sealnode.toml");
        std::fs::write(&file, "a").expect("write");
        let epoll = Epoll::new(nix::sys::epoll::EpollCreateFlags::EPOLL_CLOEXEC).expect("epoll");
        let mut w = armed(&file, &epoll);
        // Other names only: each makes IN_CREATE and IN_CLOSE_WRITE, none the config's.
        for i in 0..max / 2 + 1 {
            std::fs::File::create(d.path().join(format!("f{i}"))).expect("create");
        }
        let t0 = Instant::now();
        w.handle(t0);
        assert_eq!(w.next_deadline(), Some(t0 + SETTLE), "an overflow is a change");
    }

    /// Found by review: a config reached through a symlink on the way to its directory (a
    /// release's `current -> rel1`) kept its watch on the old directory when the link was
    /// renamed over: the new release's config never reloaded. The link's directory is watched.
    #[test]
    fn a_link_on_the_way_renamed_over_moves_the_watch() {
        let d = tempfile::tempdir().expect("tmp");
        let app = d.path().join("app");
        for r in ["rel1", "rel2"] {
            std::fs::create_dir_all(app.join(r)).expect("mkdir");
            std::fs::write(app.join(r).join("sealnode.toml"), r).expect("write");
        }
        std::os::unix::fs::symlink("rel1", app.join("current")).expect("link");
        let epoll = Epoll::new(nix::sys::epoll::EpollCreateFlags::EPOLL_CLOEXEC).expect("epoll");
        let mut w = armed(&app.join("current").join("sealnode.toml"), &epoll);
        let t0 = Instant::now();
        // Another name in the link's directory is nothing.
        std::fs::create_dir(app.join("rel3")).expect("mkdir");
        w.handle(t0);
        assert_eq!(w.next_deadline(), None, "another name beside the link");
        std::os::unix::fs::symlink("rel2", app.join(".current.new")).expect("link");
        std::fs::rename(app.join(".current.new"), app.join("current")).expect("rename over the link");
        w.handle(t0);
        assert_eq!(w.next_deadline(), Some(t0 + SETTLE), "the link renamed over is a change");
        assert!(w.due(t0 + SETTLE));
        w.taken();
        // Armed again on where the link leads now: rel2's config is watched, rel1's is not.
        std::fs::write(app.join("rel1").join("sealnode.toml"), "old").expect("write");
        w.handle(t0);
        assert_eq!(w.next_deadline(), None, "the old release is not watched any more");
        std::fs::write(app.join("rel2").join("sealnode.toml"), "new").expect("write");
        w.handle(t0);
        assert_eq!(w.next_deadline(), Some(t0 + SETTLE), "the new release is");
    }

    /// Links in links' targets are met too, each with the directory it is in.
    #[test]
    fn every_link_on_the_way_is_found() {
        let d = tempfile::tempdir().expect("tmp");
        let root = d.path().canonicalize().expect("real");
        std::fs::create_dir_all(root.join("store/r1/conf")).expect("mkdir");
        std::os::unix::fs::symlink("store", root.join("releases")).expect("link");
        std::os::unix::fs::symlink("releases/r1", root.join("current")).expect("link");
        std::os::unix::fs::symlink(root.join("current"), root.join("abs")).expect("link");
        let found = links_on_the_way(&root.join("abs/conf"));
        let want: Vec<(PathBuf, OsString)> =
            ["abs", "current", "releases"].iter().map(|n| (root.clone(), OsString::from(n))).collect();
        assert_eq!(found, want);
        assert!(links_on_the_way(&root.join("store/r1/conf")).is_empty());
    }

    /// A change is due a second after the last event; a busy cell puts it back and is said
    /// once; the directory's watch sees a rename over the config (a real inotify instance).
    #[test]
    fn a_change_settles_waits_for_a_busy_cell_and_is_seen() {
        let d = tempfile::tempdir().expect("tmp");
        let file = d.path().join("sealnode.toml");
        std::fs::write(&file, "a").expect("write");
        let epoll = Epoll::new(nix::sys::epoll::EpollCreateFlags::EPOLL_CLOEXEC).expect("epoll");
        let mut w = armed(&file, &epoll);
        let t0 = Instant::now();
        w.handle(t0);
        assert_eq!(w.next_deadline(), None, "nothing happened yet");
        std::fs::write(d.path().join("new"), "b").expect("write");
        std::fs::rename(d.path().join("new"), &file).expect("rename over the config");
        w.handle(t0);
        assert_eq!(w.next_deadline(), Some(t0 + SETTLE));
        assert!(!w.due(t0), "not settled yet");
        assert!(w.wait(t0 + SETTLE), "said the first time");
        assert!(!w.wait(t0 + SETTLE), "not again");
        assert_eq!(w.next_deadline(), Some(t0 + SETTLE + SETTLE));
        assert!(w.due(t0 + SETTLE + SETTLE));
        w.taken();
        assert_eq!(w.next_deadline(), None);
        // Another name in the directory is not the config.
        std::fs::write(d.path().join("other"), "c").expect("write");
        w.handle(t0);
        assert_eq!(w.next_deadline(), None);
        // Off: nothing is watched.
        let mut off = ConfigWatch::default();
        std::fs::write(&file, "d").expect("write");
        off.handle(t0);
        assert_eq!(off.next_deadline(), None);
    }
}
