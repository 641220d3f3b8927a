use super::{denied, fd_budget, FDS_PER_CONNECTION, FD_RESERVE};
use std::net::IpAddr;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

#[test]
fn the_deny_set() {
    let own = [ip("203.0.113.7")];
    for (a, why) in [
        ("127.0.0.1", "loopback"),
        ("127.5.6.7", "loopback"),
        ("169.254.169.254", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "this network"),
        ("224.0.0.1", "multicast"),
        ("255.255.255.255", "broadcast"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),
        ("203.0.113.7", "own addresses"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("ff02::1", "multicast"),
        ("fe80::1", "link-local"),
        ("fc00::1", "unique local"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "link-local"),
        // IPv4 inside IPv6 is judged as that IPv4 address: compatible, NAT64, 6to4.
        ("::127.0.0.1", "loopback"),
        ("::a9fe:a9fe", "link-local"),
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("64:ff9b::7f00:1", "loopback"),
        ("2002:7f00:1::1", "loopback"),
        ("2002:a9fe:a9fe::", "link-local"),
        ("2002:a01:203::1", "private"),
        ("::ffff:203.0.113.7", "own addresses"),
        ("64:ff9b::cb00:7107", "own addresses"),
        // Transition and special-purpose prefixes are refused outright.
        ("2001:0:a9fe:a9fe::80ff:fffe", "Teredo"),
        ("64:ff9b:1::7f00:1", "NAT64"),
        ("64:ff9b:1:7f00:0:100::", "NAT64"),
        ("::ffff:0:7f00:1", "IPv4-translated"),
        ("::ffff:0:a9fe:a9fe", "IPv4-translated"),
        ("fec0::1", "site-local"),
        ("2001:20::1", "ORCHID"),
        ("2001:10::1", "ORCHID"),
    ] {
        let r = denied(ip(a), &own, false);
        assert!(r.is_some_and(|r| r.contains(why)), "{a}: {r:?}");
    }
    // Private ranges pass where the upstream allows them; the rest never does.
    assert_eq!(denied(ip("10.1.2.3"), &own, true), None);
    assert_eq!(denied(ip("fc00::1"), &own, true), None);
    assert!(denied(ip("127.0.0.1"), &own, true).is_some());
    assert!(denied(ip("169.254.169.254"), &own, true).is_some());
    // Public addresses pass.
    assert_eq!(denied(ip("198.51.100.10"), &own, false), None);
    assert_eq!(denied(ip("2001:db8::1"), &own, false), None);
    assert_eq!(denied(ip("100.128.0.1"), &own, false), None);
    assert_eq!(denied(ip("64:ff9b::c633:640a"), &own, false), None, "NAT64 of a public address");
    assert_eq!(denied(ip("2002:c633:640a::1"), &own, false), None, "6to4 of a public address");
    assert_eq!(denied(ip("::ffff:198.51.100.10"), &own, false), None);
}

#[test]
fn the_fd_budget_keeps_a_reserve() {
    assert_eq!(fd_budget(1024, 0), (1024 - FD_RESERVE) / FDS_PER_CONNECTION);
    assert_eq!(fd_budget(65536, 2), (65536 - FD_RESERVE - 6) / 6);
    // The reserve grows with the routes: 250 upstreams need 750 more fds kept free.
    assert_eq!(fd_budget(1024, 251), (1024 - FD_RESERVE - 753) / 6);
    assert_eq!(fd_budget(1000, 251), 1);
    assert_eq!(fd_budget(20000, 251), (20000 - FD_RESERVE - 753) / 6);
    // Below the reserve: one connection, never zero (the node still gets its gateway).
    assert_eq!(fd_budget(100, 1), 1);
}

/// Out of fds with no connection waiting, a wake-up of the listener ends: accept4 answers
/// EMFILE whether or not one waits, so freeing the spare and trying again would go round
/// for ever. Run in a child: the fd limit and the exhaustion are the whole process's.
#[test]
fn out_of_fds_with_nothing_waiting_ends_the_wake_up() {
    use super::{Forwarder, Upstream};
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    use std::time::{Duration, Instant};
    // SAFETY: the child runs only this test's code and exits with exit_now; glibc's fork
    // keeps malloc usable in it though the test harness has other threads.
    match unsafe { nix::unistd::fork() }.expect("fork") {
        nix::unistd::ForkResult::Child => {
            let code = (|| {
                use nix::sys::resource::{getrlimit, setrlimit, Resource};
                let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
                setrlimit(Resource::RLIMIT_NOFILE, 256.min(hard), hard).ok()?;
                let l = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
                l.set_nonblocking(true).ok()?;
                let to = l.local_addr().ok()?;
                let epoll = nix::sys::epoll::Epoll::new(nix::sys::epoll::EpollCreateFlags::EPOLL_CLOEXEC).ok()?;
                let up = Upstream::new("gw.test".into(), to.port(), Some(to), false, l.into());
                let mut fw =
                    Forwarder::new(vec![up], 8, Duration::from_secs(60), Duration::from_secs(5), &epoll).ok()?;
                fw.spare.as_ref()?;
                // Every fd taken: the spare is the only one the forwarder can free.
                let mut held = Vec::new();
                while let Ok(fd) = nix::fcntl::open(
                    "/dev/null",
                    nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
                    nix::sys::stat::Mode::empty(),
                ) {
                    held.push(fd);
                }
                fw.accept(&epoll, 0);
                // Returned, with the spare taken again and nothing counted as refused.
                Some(fw.spare.is_some() && fw.upstreams[0].stats.refused_over_limit == 0)
            })();
            crate::os::sys::exit_now(match code {
                Some(true) => 0,
                Some(false) => 3,
                None => 2,
            })
        }
        nix::unistd::ForkResult::Parent { child } => {
            let deadline = Instant::now() + Duration::from_secs(20);
            let status = loop {
                match waitpid(child, Some(WaitPidFlag::WNOHANG)).expect("waitpid") {
                    WaitStatus::StillAlive if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    WaitStatus::StillAlive => {
                        let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                        let _ = waitpid(child, None);
                        panic!("accept went round and round at EMFILE with nothing waiting");
                    }
                    st => break st,
                }
            };
            assert_eq!(status, WaitStatus::Exited(child, 0), "2: the setup failed; 3: the spare or a count");
        }
    }
}
