//! UDP sockets with batched, non-blocking receive and send (`recvmmsg` / `sendmmsg`), and the
//! kernel's count of datagrams it dropped for want of socket buffer (`SO_RXQ_OVFL`), so that
//! losses on the way in are counted, not guessed.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::time::Duration;

/// Control buffer per message: room for one `SO_RXQ_OVFL` cmsg (a u32) with headers.
const CMSG_ROOM: usize = 64;

/// A peer address as the kernel gave it.
#[derive(Clone, Copy)]
pub struct Addr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl Addr {
    fn empty() -> Addr {
        Addr {
            // SAFETY: sockaddr_storage is plain bytes; all-zero is a valid (AF_UNSPEC) value.
            storage: unsafe { std::mem::zeroed() },
            len: 0,
        }
    }

    /// The address as a std type (None for a family other than IPv4/IPv6).
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        match self.storage.ss_family as i32 {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a sockaddr_in.
                let a = unsafe { &*(&self.storage as *const _ as *const libc::sockaddr_in) };
                Some(SocketAddr::from((
                    u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the storage holds a sockaddr_in6.
                let a = unsafe { &*(&self.storage as *const _ as *const libc::sockaddr_in6) };
                Some(SocketAddr::from((
                    a.sin6_addr.s6_addr,
                    u16::from_be(a.sin6_port),
                )))
            }
            _ => None,
        }
    }
}

impl std::fmt::Debug for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.socket_addr())
    }
}

fn setsockopt_int(fd: RawFd, level: i32, name: i32, v: i32) -> io::Result<()> {
    // SAFETY: a valid fd and a pointer to a live int of the length given.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Opens a non-blocking UDP socket bound to `addr`, with large buffers (as large as the
/// system allows) and drop counting on.
pub fn bind(addr: SocketAddr, buffer_bytes: usize) -> io::Result<UdpSocket> {
    let s = UdpSocket::bind(addr)?;
    configure(s, buffer_bytes)
}

/// As [`bind`], with `SO_REUSEPORT` set before the bind: several such sockets of one user
/// share `addr`'s port, and the kernel spreads the datagrams it receives over them by the
/// peers' addresses (each peer's datagrams go to one socket, so they stay in order). The
/// first of a group may ask for port 0; the others then bind the port it got.
pub fn bind_reuseport(addr: SocketAddr, buffer_bytes: usize) -> io::Result<UdpSocket> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain system call; the descriptor it returns is owned just below.
    let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a socket just opened here, owned by nothing else; the UdpSocket closes
    // it when dropped, on every path below.
    let s = unsafe { UdpSocket::from_raw_fd(fd) };
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    let (storage, len) = sockaddr_of(addr);
    // SAFETY: `storage` holds a sockaddr of `len` bytes of the socket's family.
    let rc = unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    configure(s, buffer_bytes)
}

/// `addr` as the kernel takes it.
fn sockaddr_of(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain bytes; all-zero is a valid (AF_UNSPEC) value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than, and aligned for, any sockaddr.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// Non-blocking, large buffers, drop counting on.
fn configure(s: UdpSocket, buffer_bytes: usize) -> io::Result<UdpSocket> {
    s.set_nonblocking(true)?;
    let fd = s.as_raw_fd();
    let b = buffer_bytes.min(i32::MAX as usize) as i32;
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        // FORCE works for root and ignores rmem_max; otherwise the capped request.
        if setsockopt_int(fd, libc::SOL_SOCKET, force, b).is_err() {
            let _ = setsockopt_int(fd, libc::SOL_SOCKET, plain, b);
        }
    }
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1)?;
    Ok(s)
}

/// A batch of receive buffers for one `recvmmsg`.
pub struct RecvBatch {
    cap: usize,
    bufs: Vec<u8>,
    addrs: Vec<Addr>,
    lens: Vec<usize>,
    truncated: Vec<bool>,
    cmsgs: Vec<u8>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// Highest kernel drop counter seen (cumulative per socket).
    overflow: Option<u32>,
    /// ICMP port-unreachable reports surfaced by receives (connected sockets).
    refused: u64,
}

// SAFETY: the raw pointers in iovs/hdrs point into this struct's own Vecs and are rebuilt
// before every use; nothing is shared.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    /// `n` datagrams of up to `cap` bytes each; longer ones are reported truncated.
    pub fn new(n: usize, cap: usize) -> RecvBatch {
        let n = n.max(1);
        RecvBatch {
            cap,
            bufs: vec![0; n * cap],
            addrs: vec![Addr::empty(); n],
            lens: vec![0; n],
            truncated: vec![false; n],
            cmsgs: vec![0; n * CMSG_ROOM],
            // SAFETY: iovec and mmsghdr are plain C structs; zero is a valid starting value.
            iovs: vec![unsafe { std::mem::zeroed() }; n],
            // SAFETY: as above.
            hdrs: vec![unsafe { std::mem::zeroed() }; n],
            overflow: None,
            refused: 0,
        }
    }

    /// Receives up to a batch without blocking: Ok(0) when nothing is waiting.
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        self.recv_at_most(fd, usize::MAX)
    }

    /// Receives up to a batch, and at most `max` datagrams, without blocking: Ok(0) when
    /// nothing is waiting or `max` is 0. The rest stays in the socket.
    pub fn recv_at_most(&mut self, fd: RawFd, max: usize) -> io::Result<usize> {
        let n = self.lens.len().min(max);
        if n == 0 {
            return Ok(0);
        }
        for i in 0..n {
            self.iovs[i] = libc::iovec {
                iov_base: self.bufs[i * self.cap..].as_mut_ptr().cast(),
                iov_len: self.cap,
            };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&mut self.addrs[i].storage as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = self.cmsgs[i * CMSG_ROOM..].as_mut_ptr().cast();
            h.msg_controllen = CMSG_ROOM as _;
            h.msg_flags = 0;
        }
        // SAFETY: every header points at live buffers of the lengths given, owned by self
        // and not moved during the call.
        let got = unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if got < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                // An ICMP port unreachable for a datagram this (connected) socket sent: not
                // a receive failure, but counted, so a client can tell nobody listens.
                io::ErrorKind::ConnectionRefused => {
                    self.refused += 1;
                    Ok(0)
                }
                _ => Err(e),
            };
        }
        let got = got as usize;
        for i in 0..got {
            let h = &self.hdrs[i];
            self.lens[i] = (h.msg_len as usize).min(self.cap);
            self.truncated[i] = h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            self.addrs[i].len = h.msg_hdr.msg_namelen;
            // SAFETY: the control buffer was filled by the kernel for this header; the CMSG
            // macros walk it within msg_controllen.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SO_RXQ_OVFL {
                        let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const u32);
                        self.overflow = Some(self.overflow.map_or(v, |o| o.max(v)));
                    }
                    c = libc::CMSG_NXTHDR(&h.msg_hdr, c);
                }
            }
        }
        Ok(got)
    }

    /// Datagram `i` of the last receive and whether the kernel cut it.
    pub fn datagram(&self, i: usize) -> (&[u8], bool) {
        (
            &self.bufs[i * self.cap..i * self.cap + self.lens[i]],
            self.truncated[i],
        )
    }

    pub fn addr(&self, i: usize) -> &Addr {
        &self.addrs[i]
    }

    /// The kernel's drop counter for this socket, as last reported (cumulative).
    pub fn kernel_drops(&self) -> Option<u32> {
        self.overflow
    }

    /// How many receives found an ICMP port-unreachable report instead of a datagram: on a
    /// connected socket, the peer's port was closed when a datagram got there.
    pub fn refused(&self) -> u64 {
        self.refused
    }
}

/// Outgoing datagrams gathered for one `sendmmsg`.
pub struct SendBatch {
    bufs: Vec<Vec<u8>>,
    addrs: Vec<Option<Addr>>,
    len: usize,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// Positions (in push order) of the datagrams the last flush could not send.
    failed_at: Vec<usize>,
    /// Why the last of them could not go.
    last_error: Option<io::Error>,
}

// SAFETY: as RecvBatch: the raw pointers are rebuilt from owned Vecs before each call.
unsafe impl Send for SendBatch {}

impl SendBatch {
    pub fn new(n: usize) -> SendBatch {
        let n = n.max(1);
        SendBatch {
            bufs: (0..n).map(|_| Vec::with_capacity(2048)).collect(),
            addrs: vec![None; n],
            len: 0,
            // SAFETY: plain C structs, zero is valid.
            iovs: vec![unsafe { std::mem::zeroed() }; n],
            // SAFETY: as above.
            hdrs: vec![unsafe { std::mem::zeroed() }; n],
            failed_at: Vec::new(),
            last_error: None,
        }
    }

    /// Positions, in push order, of the datagrams the last [`flush`](Self::flush) failed to
    /// send (a failure is skipped and the rest still go, so they need not be the last ones).
    pub fn failed(&self) -> &[usize] {
        &self.failed_at
    }

    /// The error of the last datagram the last flush failed to send (None when all went).
    pub fn last_error(&self) -> Option<&io::Error> {
        self.last_error.as_ref()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn is_full(&self) -> bool {
        self.len == self.bufs.len()
    }

    /// A cleared buffer for the next datagram, to `to` (None on a connected socket). The
    /// caller flushes first when the batch is full.
    pub fn push(&mut self, to: Option<&Addr>) -> &mut Vec<u8> {
        assert!(!self.is_full(), "flush a full send batch first");
        let i = self.len;
        self.len += 1;
        self.addrs[i] = to.copied();
        let b = &mut self.bufs[i];
        b.clear();
        b
    }

    /// Sends everything gathered. Returns (sent, failed); a full socket buffer is retried for
    /// up to `patience`, then the datagram at hand counts as failed and the rest are tried
    /// ([`failed`](Self::failed) says which). The batch is empty afterwards.
    pub fn flush(&mut self, fd: RawFd, patience: std::time::Duration) -> (usize, usize) {
        let n = self.len;
        self.failed_at.clear();
        self.last_error = None;
        for i in 0..n {
            self.iovs[i] = libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: self.bufs[i].len(),
            };
            let h = &mut self.hdrs[i].msg_hdr;
            match &mut self.addrs[i] {
                Some(a) => {
                    h.msg_name = (&mut a.storage as *mut libc::sockaddr_storage).cast();
                    h.msg_namelen = a.len;
                }
                None => {
                    h.msg_name = std::ptr::null_mut();
                    h.msg_namelen = 0;
                }
            }
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
        }
        let (mut done, mut failed) = (0usize, 0usize);
        let start = std::time::Instant::now();
        while done + failed < n {
            // SAFETY: headers [done+failed, n) point at live buffers owned by self.
            let rc = unsafe {
                libc::sendmmsg(
                    fd,
                    self.hdrs[done + failed..].as_mut_ptr(),
                    (n - done - failed) as u32,
                    libc::MSG_DONTWAIT,
                )
            };
            if rc > 0 {
                done += rc as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    if start.elapsed() < patience =>
                {
                    std::hint::spin_loop()
                }
                // This one datagram cannot go (peer gone, too large, buffer full too long).
                _ => {
                    self.failed_at.push(done + failed);
                    failed += 1;
                    self.last_error = Some(e);
                }
            }
        }
        self.len = 0;
        (done, failed)
    }
}

/// Blocks until `fd` has something to read or `timeout_ms` pass (a signal ends it early too;
/// the caller looks again either way).
pub(crate) fn wait_readable(fd: RawFd, timeout_ms: i32) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, for the duration of the call. Errors (EINTR) need no handling:
    // the caller receives next, or comes back here.
    unsafe { libc::poll(&mut p, 1, timeout_ms) };
}

/// Blocks until one of `fds` has something to read or `timeout` passes (to the microsecond:
/// `ppoll(2)`), as [`wait_readable`] does for one. Returns, per fd, whether it was found
/// readable (or in error, which a receive then reports); all false after a timeout or a signal.
pub(crate) fn wait_readable_any(fds: &[RawFd], timeout: Duration) -> Vec<bool> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: p.len() live pollfds and one timespec, for the duration of the call; no signal
    // mask (null leaves the thread's as it is). Errors as in wait_readable.
    let n = unsafe {
        libc::ppoll(
            p.as_mut_ptr(),
            p.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    p.iter().map(|q| n > 0 && q.revents != 0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_receive_takes_at_most_what_it_is_allowed_and_leaves_the_rest() {
        let sock = bind("127.0.0.1:0".parse().unwrap(), 1 << 16).unwrap();
        let to = sock.local_addr().unwrap();
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..5u8 {
            client.send_to(&[i; 9], to).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut rx = RecvBatch::new(32, 64);
        let fd = sock.as_raw_fd();
        assert_eq!(rx.recv_at_most(fd, 0).unwrap(), 0);
        assert_eq!(rx.recv_at_most(fd, 2).unwrap(), 2);
        assert_eq!(
            (rx.datagram(0).0, rx.datagram(1).0),
            (&[0u8; 9][..], &[1u8; 9][..])
        );
        assert_eq!(rx.recv(fd).unwrap(), 3);
        assert_eq!(rx.datagram(2).0, &[4u8; 9][..]);
        assert_eq!(rx.recv(fd).unwrap(), 0);
    }

    #[test]
    fn reuseport_sockets_share_a_port_that_a_plain_bind_cannot_take() {
        let first = bind_reuseport("127.0.0.1:0".parse().unwrap(), 1 << 16).unwrap();
        let addr = first.local_addr().unwrap();
        assert_ne!(addr.port(), 0);
        let second = bind_reuseport(addr, 1 << 16).unwrap();
        assert_eq!(second.local_addr().unwrap(), addr);
        let plain = bind(addr, 1 << 16).unwrap_err();
        assert_eq!(plain.kind(), io::ErrorKind::AddrInUse);
        // Each is non-blocking, as `bind`'s are: an empty socket says so at once.
        let mut b = [0u8; 8];
        assert_eq!(
            first.recv(&mut b).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        // A datagram to the port reaches one of the two (which one is the kernel's choice).
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        c.send_to(b"reuse", addr).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let got = loop {
            if let Some(n) = [&first, &second].iter().find_map(|s| s.recv(&mut b).ok()) {
                break n;
            }
            assert!(std::time::Instant::now() < deadline, "no datagram in 5 s");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(&b[..got], b"reuse");
    }

    #[test]
    fn reuseport_binds_ipv6_addresses_with_their_port() {
        // Hosts without IPv6 loopback cannot bind [::1]; nothing to check there.
        let Ok(first) = bind_reuseport("[::1]:0".parse().unwrap(), 1 << 16) else {
            eprintln!("skipped: no IPv6 loopback");
            return;
        };
        let addr = first.local_addr().unwrap();
        assert!(addr.is_ipv6() && addr.port() != 0);
        assert_eq!(
            bind_reuseport(addr, 1 << 16).unwrap().local_addr().unwrap(),
            addr
        );
    }

    #[test]
    fn a_failed_datagram_is_reported_where_it_was_in_the_batch() {
        use std::os::fd::AsRawFd;
        let a = bind("127.0.0.1:0".parse().unwrap(), 1 << 20).unwrap();
        let b = bind("127.0.0.1:0".parse().unwrap(), 1 << 20).unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        let mut tx = SendBatch::new(4);
        tx.push(None).extend_from_slice(b"first");
        tx.push(None).resize(70_000, 7); // larger than any UDP datagram: EMSGSIZE
        tx.push(None).extend_from_slice(b"third");
        let (sent, failed) = tx.flush(a.as_raw_fd(), Duration::from_millis(50));
        assert_eq!((sent, failed), (2, 1));
        assert_eq!(tx.failed(), &[1]);
        assert_eq!(
            tx.last_error().and_then(|e| e.raw_os_error()),
            Some(libc::EMSGSIZE)
        );
        let (sent, failed) = {
            tx.push(None).extend_from_slice(b"again");
            tx.flush(a.as_raw_fd(), Duration::from_millis(50))
        };
        assert_eq!((sent, failed), (1, 0));
        assert!(tx.failed().is_empty());
        assert!(tx.last_error().is_none());
    }

    #[test]
    fn batches_cross_loopback_with_addresses_and_truncation() {
        let a = bind("127.0.0.1:0".parse().unwrap(), 1 << 20).unwrap();
        let b = bind("127.0.0.1:0".parse().unwrap(), 1 << 20).unwrap();
        let mut tx = SendBatch::new(8);
        let to = {
            let mut rx = RecvBatch::new(1, 64);
            // Learn b's address as an Addr by sending one datagram from b to a.
            b.send_to(b"hi", a.local_addr().unwrap()).unwrap();
            let start = std::time::Instant::now();
            while rx.recv(a.as_raw_fd()).unwrap() == 0 {
                assert!(start.elapsed() < Duration::from_secs(5));
            }
            assert_eq!(rx.datagram(0), (&b"hi"[..], false));
            assert_eq!(rx.addr(0).socket_addr(), Some(b.local_addr().unwrap()));
            *rx.addr(0)
        };
        for i in 0..5u8 {
            tx.push(Some(&to))
                .extend_from_slice(&vec![i; 10 + i as usize * 20]);
        }
        assert_eq!(tx.flush(a.as_raw_fd(), Duration::from_millis(100)), (5, 0));
        assert!(tx.is_empty());
        let mut rx = RecvBatch::new(8, 64);
        let mut got = Vec::new();
        let start = std::time::Instant::now();
        while got.len() < 5 {
            assert!(start.elapsed() < Duration::from_secs(5));
            let n = rx.recv(b.as_raw_fd()).unwrap();
            for i in 0..n {
                let (d, t) = rx.datagram(i);
                got.push((d.to_vec(), t));
            }
        }
        for (i, (d, t)) in got.iter().enumerate() {
            let full = 10 + i * 20;
            assert_eq!(*t, full > 64, "datagram {i}");
            assert_eq!(d.len(), full.min(64));
            assert!(d.iter().all(|&x| x == i as u8));
        }
    }
}
