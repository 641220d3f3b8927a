//! Which addresses an egress upstream's name may resolve to: not the host, its networks or
//! the places that would turn the node's egress against them (pure, but for the host's own
//! addresses).

/// Why `ip` may not be an egress upstream's address, if it may not: the places a name could
/// be pointed at to turn the node's egress against the host or its network. `own`: the host's
/// own addresses. Private ranges pass only where the upstream allows them.
pub fn denied(ip: std::net::IpAddr, own: &[std::net::IpAddr], allow_private: bool) -> Option<&'static str> {
    use std::net::IpAddr;
    if let IpAddr::V6(v6) = ip {
        // An IPv6 address that carries an IPv4 one is judged as that IPv4 address too: a name
        // does not reach 127.0.0.1 or 169.254.169.254 through a translator (unit test:
        // egress::tests::the_deny_set).
        if let Some(v4) = embedded_ipv4(v6) {
            if let Some(why) = denied(IpAddr::V4(v4), own, allow_private) {
                return Some(why);
            }
            if v6.to_ipv4_mapped().is_some() {
                return None;
            }
        }
    }
    if own.contains(&ip) {
        return Some("one of this host's own addresses");
    }
    if let Some(service) = cloud_service(ip) {
        return Some(service);
    }
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_link_local() {
                Some("link-local (169.254.0.0/16, cloud metadata services)")
            } else if a.is_unspecified() || o[0] == 0 {
                Some("unspecified or 'this network' (0.0.0.0/8)")
            } else if a.is_multicast() || a.is_broadcast() {
                Some("multicast or broadcast")
            } else if !allow_private && (a.is_private() || (o[0] == 100 && (o[1] & 0xc0) == 64)) {
                Some("private (10/8, 172.16/12, 192.168/16, 100.64/10); set allow_private for this upstream")
            } else {
                None
            }
        }
        IpAddr::V6(a) => {
            let seg = a.segments();
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_unspecified() {
                Some("unspecified")
            } else if a.is_multicast() {
                Some("multicast")
            } else if (seg[0] & 0xffc0) == 0xfe80 {
                Some("link-local (fe80::/10)")
            } else if (seg[0] & 0xffc0) == 0xfec0 {
                Some("site-local (fec0::/10)")
            } else if seg[0] == 0x2001 && seg[1] == 0 {
                Some("Teredo (2001::/32): a tunnel that carries IPv4 addresses")
            } else if seg[..3] == [0x64, 0xff9b, 1] {
                Some("local-use NAT64 (64:ff9b:1::/48): a translator to IPv4")
            } else if seg[..6] == [0, 0, 0, 0, 0xffff, 0] {
                Some("IPv4-translated (::ffff:0:0:0/96)")
            } else if seg[0] == 0x2001 && matches!(seg[1] & 0xfff0, 0x10 | 0x20) {
                Some("ORCHID (2001:10::/28, 2001:20::/28): not routable")
            } else if !allow_private && (seg[0] & 0xfe00) == 0xfc00 {
                Some("unique local (fc00::/7); set allow_private for this upstream")
            } else {
                None
            }
        }
    }
}

/// A cloud's instance services outside the link-local ranges: its metadata, agent or DNS
/// endpoints, refused whatever `allow_private` says (found by review: with it, AWS's IPv6
/// metadata address passed, and Azure's WireServer, a public address, passed always).
fn cloud_service(ip: std::net::IpAddr) -> Option<&'static str> {
    use std::net::IpAddr;
    match ip {
        // Azure's WireServer (the agent's channel, the VM's DNS and health probes).
        IpAddr::V4(a) if a.octets() == [168, 63, 129, 16] => Some("a cloud's instance service (Azure's WireServer)"),
        // Oracle Cloud's older metadata address.
        IpAddr::V4(a) if a.octets() == [192, 0, 0, 192] => {
            Some("a cloud's instance service (Oracle Cloud's, 192.0.0.192)")
        }
        // Alibaba Cloud's metadata service (inside 100.64/10).
        IpAddr::V4(a) if a.octets() == [100, 100, 100, 200] => {
            Some("a cloud's instance service (Alibaba Cloud's metadata)")
        }
        // AWS's instance services over IPv6 (metadata fd00:ec2::254, DNS ::253, time ::123).
        IpAddr::V6(a) if a.segments()[..2] == [0xfd00, 0x0ec2] => {
            Some("a cloud's instance service (AWS, fd00:ec2::/32)")
        }
        // Google Cloud's metadata server over IPv6.
        IpAddr::V6(a) if a.segments() == [0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254] => {
            Some("a cloud's instance service (Google Cloud's metadata, fd20:ce::254)")
        }
        _ => None,
    }
}

/// The IPv4 address inside an IPv6 one: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible
/// (`::a.b.c.d`, deprecated but still routed by some stacks), NAT64's well-known prefix
/// (`64:ff9b::/96`, RFC 6052) and 6to4 (`2002:AABB:CCDD::/48`, RFC 3056).
fn embedded_ipv4(a: std::net::Ipv6Addr) -> Option<std::net::Ipv4Addr> {
    let seg = a.segments();
    let tail = |hi: u16, lo: u16| std::net::Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if let Some(v4) = a.to_ipv4_mapped() {
        return Some(v4);
    }
    if seg[..6] == [0; 6] && !(seg[6] == 0 && seg[7] <= 1) {
        return Some(tail(seg[6], seg[7]));
    }
    if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(tail(seg[6], seg[7]));
    }
    if seg[0] == 0x2002 {
        return Some(tail(seg[1], seg[2]));
    }
    None
}

/// This host's own addresses, every interface.
pub(super) fn own_addresses() -> Vec<std::net::IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else { return Vec::new() };
    addrs
        .filter_map(|i| {
            let a = i.address?;
            if let Some(v4) = a.as_sockaddr_in() {
                return Some(std::net::IpAddr::V4(v4.ip()));
            }
            a.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip()))
        })
        .collect()
}
