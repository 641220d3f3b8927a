//! Credentials and capabilities: become the role's ids, then shed every capability.

use caps::CapSet;
use nix::errno::Errno;
use nix::unistd::{Gid, Uid};

use crate::config::Ids;
use crate::os::sys;

fn caps_err(_: caps::errors::CapsError) -> Errno {
    Errno::EPERM
}

/// Rootful: drop root's supplementary groups and use the role's ids for file access while
/// keeping every capability of the cell's user namespace for the mounts that follow.
pub fn rootful_fs_ids(ids: Ids) -> Result<(), Errno> {
    sys::clear_groups()?;
    nix::unistd::setfsgid(Gid::from_raw(ids.gid));
    nix::unistd::setfsuid(Uid::from_raw(ids.uid));
    // setfs*id report no errors; read them back.
    if nix::unistd::setfsuid(Uid::from_raw(ids.uid)).as_raw() != ids.uid {
        return Err(Errno::EPERM);
    }
    Ok(())
}

/// The intermediate that clones a role into a cell: its effective ids become the role's, so
/// the role's own user namespace is created by (and owned by) an id the cell maps (the kernel
/// refuses a creator it does not: EPERM; rootful, kuid 0 is unmapped in the cell). Real and
/// saved ids stay, so the permitted set is kept; the effective set, cleared by the change, is
/// raised again for the id maps written next, and the process made dumpable again. The
/// filesystem ids follow (the role's cgroup leaf, which does not let the role's ids in, was
/// entered before: the intermediate is cloned into it). Read back.
pub fn effective_ids_of(ids: Ids) -> Result<(), Errno> {
    // u32::MAX (-1): that id unchanged.
    nix::unistd::setresgid(Gid::from_raw(u32::MAX), Gid::from_raw(ids.gid), Gid::from_raw(u32::MAX))?;
    nix::unistd::setresuid(Uid::from_raw(u32::MAX), Uid::from_raw(ids.uid), Uid::from_raw(u32::MAX))?;
    let (_, permitted, inheritable) = sys::capget()?;
    sys::capset(permitted, permitted, inheritable)?;
    // The id change made this process (and the role it clones) not dumpable, which gives the
    // role's /proc files to kuid 0, unmapped in the cell: its id maps could not be opened. The
    // role (another user namespace, and real and saved ids that are not its) can no more trace
    // this process for it.
    sys::prctl(libc::PR_SET_DUMPABLE, 1)?;
    if nix::unistd::geteuid().as_raw() != ids.uid || nix::unistd::getegid().as_raw() != ids.gid {
        return Err(Errno::EPERM);
    }
    Ok(())
}

/// Switch to the role's gid then uid, keeping the permitted set for the capability drop
/// that follows (the bounding set can only be reduced while CAP_SETPCAP is held).
pub fn set_ids(ids: Ids) -> Result<(), Errno> {
    sys::prctl(libc::PR_SET_KEEPCAPS, 1)?;
    sys::set_ids(ids.uid, ids.gid)
}

/// Drop every capability in all five sets (bounding first, while CAP_SETPCAP is usable),
/// set no_new_privs, and verify nothing is left. A handful of system calls: one pass over the
/// bounding set, then one call each for ambient and the other three sets.
pub fn drop_all() -> Result<(), Errno> {
    let (_, permitted, _) = sys::capget()?;
    sys::capset(permitted, permitted, 0)?;
    sys::drop_bounding_set()?;
    sys::prctl_ambient_clear_all()?;
    sys::capset(0, 0, 0)?;
    sys::prctl(libc::PR_SET_KEEPCAPS, 0)?;
    sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1)?;
    // Verify: three sets in one call; the bounding set's first entry (the pass starts there;
    // the launcher reads all five sets from /proc once the workload runs); ambient holds nothing
    // raisable once permitted and inheritable are empty; no_new_privs (a faked prctl).
    if sys::capget()? != (0, 0, 0) || sys::capbset_has(0)? || !no_new_privs()? {
        return Err(Errno::EPERM);
    }
    Ok(())
}

/// The layer matrix's "credentials off": keep every capability of the sandbox's user
/// namespace across execve (inheritable + ambient). Never used outside the matrix.
pub fn keep_all_across_exec() -> Result<(), Errno> {
    let permitted = caps::read(None, CapSet::Permitted).map_err(caps_err)?;
    caps::set(None, CapSet::Effective, &permitted).map_err(caps_err)?;
    caps::set(None, CapSet::Inheritable, &permitted).map_err(caps_err)?;
    for c in permitted {
        caps::raise(None, CapSet::Ambient, c).map_err(caps_err)?;
    }
    Ok(())
}

/// Sandbox init's drop: it never executes anything, so its bounding set cannot matter (it only
/// limits what an exec could gain); permitted, effective, inheritable and ambient are emptied,
/// no_new_privs set, and the result verified.
pub fn drop_all_no_exec() -> Result<(), Errno> {
    sys::prctl_ambient_clear_all()?;
    sys::capset(0, 0, 0)?;
    sys::prctl(libc::PR_SET_KEEPCAPS, 0)?;
    sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1)?;
    if sys::capget()? != (0, 0, 0) || !no_new_privs()? {
        return Err(Errno::EPERM);
    }
    Ok(())
}

/// Whether no_new_privs is set, as PR_GET_NO_NEW_PRIVS answers (a faked answer is 0: unset).
fn no_new_privs() -> Result<bool, Errno> {
    // SAFETY: PR_GET_NO_NEW_PRIVS takes no pointer.
    Errno::result(unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) }).map(|v| v == 1)
}
