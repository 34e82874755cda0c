//! The gdr-dma VFIO test program of scripts/qemu-dma-test.sh.
//!
//! Inside the VM (`guest`): drives QEMU's edu device through VFIO and the emulated IOMMU, with
//! an ivshmem BAR as peer memory, and prints one `GDRTEST PASS|FAIL name detail` line per case.
//! On the host (`host-fill`, `host-check`): prepares and checks the file behind ivshmem, so
//! peer-memory copies are verified from outside the VM too.
//!
//! Peer memory layout (8 MiB): [0, 4 MiB) is filled by the host with seeded random words for
//! the peer -> host copy; [4 MiB, 8 MiB) is poisoned by the host and written by the guest's
//! host -> peer copy, then checked by the host.

use gdr_dma::pattern::{check_surface, poison, surface, SURFACE_BYTES};
use gdr_dma::{
    Bdf, Copier, DmaDirection, DmaError, Endpoint, IovaRange, MappedMemory, OpenOptions, Segment,
    Session,
};
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

const HALF: usize = 4 << 20;
const PEER_LEN: usize = 8 << 20;

/// Seeded random words: the same on host and guest.
fn words(seed: u64, salt: u64, n: usize) -> Vec<u32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..n).map(|_| r.gen()).collect()
}
const SALT_TO_HOST: u64 = 0xa;
const SALT_TO_PEER: u64 = 0xb;

fn to_bytes(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn mismatch(want: &[u32], got: &[u32]) -> Option<String> {
    let bad: Vec<usize> = (0..want.len()).filter(|&i| want[i] != got[i]).collect();
    bad.first().map(|&i| {
        format!(
            "{} of {} words differ, first at {i}: want {:#010x} got {:#010x}",
            bad.len(),
            want.len(),
            want[i],
            got[i]
        )
    })
}

fn host_fill(path: &str, seed: u64) -> Result<String, String> {
    let mut img = to_bytes(&words(seed, SALT_TO_HOST, HALF / 4));
    let expect = words(seed, SALT_TO_PEER, HALF / 4);
    img.extend(to_bytes(&expect.iter().map(|w| !w).collect::<Vec<_>>()));
    std::fs::write(path, &img).map_err(|e| format!("{path}: {e}"))?;
    Ok(format!(
        "wrote the {} bytes behind ivshmem: the guest's source half, and a poisoned half for it \
         to overwrite",
        img.len()
    ))
}

fn host_check(path: &str, seed: u64) -> Result<String, String> {
    let img = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    if img.len() != PEER_LEN {
        return Err(format!("{path} has {} bytes, want {PEER_LEN}", img.len()));
    }
    let got = from_bytes(&img[HALF..]);
    match mismatch(&words(seed, SALT_TO_PEER, HALF / 4), &got) {
        None => Ok(format!(
            "{HALF} bytes written by the guest's host->peer copy match"
        )),
        Some(m) => Err(m),
    }
}

struct Report {
    passed: usize,
    failed: usize,
}

impl Report {
    fn case(&mut self, name: &str, f: impl FnOnce() -> Result<String, String>) {
        let t = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .unwrap_or_else(|_| Err("panicked".to_string()));
        let ms = t.elapsed().as_millis();
        match r {
            Ok(d) => {
                self.passed += 1;
                println!("GDRTEST PASS {name} {d} ({ms} ms)");
            }
            Err(d) => {
                self.failed += 1;
                println!("GDRTEST FAIL {name} {d} ({ms} ms)");
            }
        }
    }
}

fn e2s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Copies a small random block host -> device -> host and checks it: the device still works.
fn round_trip(s: &mut Session, len: usize, seed: u64) -> Result<String, String> {
    let src = s.space.alloc_buffer(len, "rt-src").map_err(e2s)?;
    let dst = s.space.alloc_buffer(len, "rt-dst").map_err(e2s)?;
    let data = words(seed, 0x77, len / 4);
    src.write_u32s(0, &data).map_err(e2s)?;
    dst.write_u32s(0, &data.iter().map(|w| !w).collect::<Vec<_>>())
        .map_err(e2s)?;
    let st = Copier::new(s.engine.as_mut(), &s.space)
        .copy(
            &Endpoint::iova(src.range()),
            &Endpoint::iova(dst.range()),
            len as u64,
        )
        .map_err(e2s)?;
    let mut got = vec![0u32; len / 4];
    dst.read_u32s(0, &mut got).map_err(e2s)?;
    match mismatch(&data, &got) {
        None => Ok(format!("{len} bytes in {} submissions", st.submissions)),
        Some(m) => Err(m),
    }
}

/// Waits for a DMAR fault naming the device in the kernel log.
fn dmar_fault_logged(bdf: &str, within: Duration) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let short = bdf.trim_start_matches("0000:");
    let t = Instant::now();
    while t.elapsed() < within {
        // /dev/kmsg gives one record per read; a fresh open starts at the oldest record.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
        {
            let mut buf = vec![0u8; 8192];
            while let Ok(n) = f.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let line = String::from_utf8_lossy(&buf[..n]);
                if line.contains("DMAR") && line.contains(short) && line.contains("fault") {
                    return Some(line.trim().rsplit(';').next().unwrap_or("").to_string());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn guest(dev: &str, peer: &str, seed: u64) -> Report {
    let mut rep = Report {
        passed: 0,
        failed: 0,
    };
    let (dev, peer) = match (dev.parse::<Bdf>(), peer.parse::<Bdf>()) {
        (Ok(d), Ok(p)) => (d, p),
        _ => {
            rep.case("args", || Err("bad PCI address".into()));
            return rep;
        }
    };
    let mut session = None;
    rep.case("open", || {
        let s = Session::open(&dev, &OpenOptions::default()).map_err(e2s)?;
        let d = format!(
            "engine {} limits {:?} iova ranges {:x?}",
            s.engine.name(),
            s.engine.limits(),
            s.iova_ranges()
        );
        session = Some(s);
        Ok(d)
    });
    let Some(mut s) = session else { return rep };

    rep.case("surface-host-device-host", || {
        let src = s
            .space
            .alloc_buffer(SURFACE_BYTES, "surface-src")
            .map_err(e2s)?;
        let dst = s
            .space
            .alloc_buffer(SURFACE_BYTES, "surface-dst")
            .map_err(e2s)?;
        let n = SURFACE_BYTES / 4;
        src.write_u32s(0, &surface(n)).map_err(e2s)?;
        dst.write_u32s(0, &poison(n)).map_err(e2s)?;
        let st = Copier::new(s.engine.as_mut(), &s.space)
            .copy(
                &Endpoint::iova(src.range()),
                &Endpoint::iova(dst.range()),
                SURFACE_BYTES as u64,
            )
            .map_err(e2s)?;
        let mut got = vec![0u32; n];
        dst.read_u32s(0, &mut got).map_err(e2s)?;
        let (first, bad) = check_surface(&got, 3);
        if bad > 0 {
            return Err(format!("{bad} words wrong, first {first:x?}"));
        }
        if st.interrupts < st.descriptors {
            return Err(format!("expected an interrupt per edu transfer: {st:?}"));
        }
        Ok(format!(
            "{} bytes verified word by word; {} submissions, {} interrupts, {:.2?} of DMA in \
             guest time (QEMU's -icount clock, not the host's: it runs ahead of wall time)",
            st.bytes / 2,
            st.submissions,
            st.interrupts,
            st.elapsed
        ))
    });

    let peer_dev = match s.open_peer(&peer) {
        Ok(d) => Some(d),
        Err(e) => {
            rep.case("open-peer", || Err(e.to_string()));
            None
        }
    };
    if let Some(pd) = &peer_dev {
        let bar = match pd.map_bar(2) {
            Ok(b) if b.size() == PEER_LEN => Some(b),
            Ok(b) => {
                rep.case("peer-bar", || Err(format!("BAR2 has {} bytes", b.size())));
                None
            }
            Err(e) => {
                rep.case("peer-bar", || Err(e.to_string()));
                None
            }
        };
        if let Some(bar) = &bar {
            // SAFETY: the mapping is dropped at the end of this block, before the BAR is.
            let mapping = unsafe { s.space.map(bar, "ivshmem BAR2") };
            match mapping {
                Err(e) => rep.case("peer-map", || Err(e.to_string())),
                Ok(pm) => {
                    rep.case("peer-to-host", || {
                        let want = words(seed, SALT_TO_HOST, HALF / 4);
                        let dst = s.space.alloc_buffer(HALF, "from-peer").map_err(e2s)?;
                        dst.write_u32s(0, &want.iter().map(|w| !w).collect::<Vec<_>>())
                            .map_err(e2s)?;
                        let st = Copier::new(s.engine.as_mut(), &s.space)
                            .copy(
                                &Endpoint::iova(pm.range().slice(0, HALF as u64).map_err(e2s)?),
                                &Endpoint::iova(dst.range()),
                                HALF as u64,
                            )
                            .map_err(e2s)?;
                        let mut got = vec![0u32; HALF / 4];
                        dst.read_u32s(0, &mut got).map_err(e2s)?;
                        match mismatch(&want, &got) {
                            None => Ok(format!(
                                "{HALF} bytes of host-written peer memory arrived intact ({} submissions)",
                                st.submissions
                            )),
                            Some(m) => Err(m),
                        }
                    });
                    rep.case("host-to-peer", || {
                        let data = words(seed, SALT_TO_PEER, HALF / 4);
                        let src = s.space.alloc_buffer(HALF, "to-peer").map_err(e2s)?;
                        src.write_u32s(0, &data).map_err(e2s)?;
                        Copier::new(s.engine.as_mut(), &s.space)
                            .copy(
                                &Endpoint::iova(src.range()),
                                &Endpoint::iova(
                                    pm.range().slice(HALF as u64, HALF as u64).map_err(e2s)?,
                                ),
                                HALF as u64,
                            )
                            .map_err(e2s)?;
                        let mut got = vec![0u32; HALF / 4];
                        bar.read_u32s(HALF, &mut got).map_err(e2s)?;
                        match mismatch(&data, &got) {
                            None => Ok(format!(
                                "{HALF} bytes in the peer BAR (host checks the file)"
                            )),
                            Some(m) => Err(m),
                        }
                    });
                }
            }
        }
    }

    rep.case("error-unmapped-iova", || {
        let _buf = s.space.alloc_buffer(1 << 16, "small").map_err(e2s)?;
        let dst = s.space.alloc_buffer(1 << 16, "small-dst").map_err(e2s)?;
        let never = IovaRange::new(s.space.limit() - (1 << 20), 1 << 16);
        // Straddling the end of the highest mapping: its first page is mapped, the next not.
        let top = s
            .space
            .mappings()
            .iter()
            .filter_map(|(r, _)| r.end())
            .max()
            .ok_or("no mappings")?;
        let past_end = IovaRange::new(top - 4096, 8192);
        let mut out = Vec::new();
        for (what, r) in [
            ("never mapped", never),
            ("straddling the end of a mapping", past_end),
        ] {
            let t = Instant::now();
            let e = Copier::new(s.engine.as_mut(), &s.space).copy(
                &Endpoint::iova(r),
                &Endpoint::iova(dst.range()),
                r.len,
            );
            match e {
                Err(DmaError::Unmapped { .. }) if t.elapsed() < Duration::from_secs(1) => {
                    out.push(format!("{what}: refused"))
                }
                other => return Err(format!("{what}: {other:?}")),
            }
        }
        // Around the checks, straight to the engine: the IOMMU must block the device, and the
        // call must come back, not hang.
        let t = Instant::now();
        s.engine
            .submit(
                DmaDirection::ToDevice,
                &[Segment {
                    iova: never.iova,
                    dev: 0,
                    len: 2048,
                }],
                Duration::from_secs(5),
            )
            .map_err(|e| format!("raw submit: {e}"))?;
        let fault = dmar_fault_logged(&dev.to_string(), Duration::from_secs(2))
            .ok_or("no DMAR fault logged for the raw transfer")?;
        out.push(format!(
            "raw transfer returned in {:?}, IOMMU logged: {fault}",
            t.elapsed()
        ));
        Ok(out.join("; "))
    });

    rep.case("error-oversize", || {
        let buf = s.space.alloc_buffer(1 << 16, "os").map_err(e2s)?;
        let dst = s.space.alloc_buffer(1 << 16, "os-dst").map_err(e2s)?;
        let mut c = Copier::new(s.engine.as_mut(), &s.space);
        let mut out = Vec::new();
        let e = c.copy(
            &Endpoint::iova(buf.range()),
            &Endpoint::iova(dst.range()),
            2 << 16,
        );
        if !matches!(e, Err(DmaError::Oversize { .. })) {
            return Err(format!("copy longer than the buffers: {e:?}"));
        }
        out.push("copy past the buffers");
        let e = c.copy(&Endpoint::iova(buf.range()), &Endpoint::Device(4000), 200);
        if !matches!(e, Err(DmaError::Oversize { .. })) {
            return Err(format!("past the device buffer: {e:?}"));
        }
        out.push("past the 4 KiB device buffer");
        let e = s.engine.submit(
            DmaDirection::ToDevice,
            &[Segment {
                iova: buf.iova(),
                dev: 0,
                len: 8192,
            }],
            Duration::from_secs(1),
        );
        if !matches!(e, Err(DmaError::Oversize { .. })) {
            return Err(format!("8 KiB descriptor: {e:?}"));
        }
        out.push("8 KiB descriptor");
        // A transfer ending at the buffer's last byte would abort QEMU 7.2's whole VM.
        let e = s.engine.submit(
            DmaDirection::FromDevice,
            &[Segment {
                iova: buf.iova(),
                dev: 0,
                len: 4096,
            }],
            Duration::from_secs(1),
        );
        if !matches!(e, Err(DmaError::Oversize { .. })) {
            return Err(format!("transfer to the buffer's last byte: {e:?}"));
        }
        out.push("a transfer to the buffer's last byte");
        Ok(format!("refused: {}", out.join(", ")))
    });

    rep.case("error-misaligned", || {
        let host = gdr_dma::HostPages::new(3 * 4096).map_err(e2s)?;
        // SAFETY: refused (misaligned), so nothing is mapped.
        match unsafe { s.space.map_part(&host, 100, 4096, "odd") } {
            Err(DmaError::Misaligned { .. }) => {}
            other => return Err(format!("map at offset 100: {:?}", other.map(|m| m.iova()))),
        }
        // Around our check, the kernel's VFIO refuses it as well.
        let vaddr = host.cpu_ptr() as usize + 100;
        let iova = s.space.limit() - (2 << 20);
        match s.space.backend().map(vaddr, iova, 4096) {
            Err(DmaError::Sys { source, .. }) if source.raw_os_error() == Some(22) => {
                Ok("refused by gdr-dma, and by VFIO with EINVAL".into())
            }
            Err(e) => Err(format!("kernel said: {e}")),
            Ok(()) => {
                let _ = s.space.backend().unmap(iova, 4096);
                Err("VFIO mapped a misaligned address".into())
            }
        }
    });

    rep.case("timeout-is-bounded", || {
        let buf = s.space.alloc_buffer(4096, "to").map_err(e2s)?;
        let t = Instant::now();
        let e = s.engine.submit(
            DmaDirection::ToDevice,
            &[Segment {
                iova: buf.iova(),
                dev: 0,
                len: 2048,
            }],
            Duration::from_millis(1),
        );
        let took = t.elapsed();
        match e {
            Err(DmaError::Timeout { .. }) if took < Duration::from_millis(500) => {}
            other => return Err(format!("{other:?} after {took:?}")),
        }
        // edu cannot abort a transfer: the engine waits for it before reporting the timeout,
        // so the device is idle again now (the next case uses it at once).
        Ok(format!(
            "edu's 100 ms transfer with a 1 ms limit: Timeout after {took:?}"
        ))
    });

    rep.case("device-works-after-errors", || {
        round_trip(&mut s, 3 * 4096 + 512, seed)
    });
    drop(peer_dev);
    drop(s);

    rep.case("polling-session", || {
        let opts = OpenOptions {
            interrupts: false,
            ..OpenOptions::default()
        };
        let mut s = Session::open(&dev, &opts).map_err(e2s)?;
        round_trip(&mut s, 64 << 10, seed ^ 1).map(|d| format!("{d}, polled"))
    });
    rep
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seed_at = |i: usize| -> u64 { args.get(i).and_then(|s| s.parse().ok()).unwrap_or(0) };
    let code = match args.get(1).map(String::as_str) {
        Some("host-fill") | Some("host-check") => {
            let path = args.get(2).cloned().unwrap_or_default();
            let r = if args[1] == "host-fill" {
                host_fill(&path, seed_at(3))
            } else {
                host_check(&path, seed_at(3))
            };
            match r {
                Ok(m) => {
                    println!("{m}");
                    0
                }
                Err(m) => {
                    println!("{m}");
                    1
                }
            }
        }
        Some("guest") => {
            let opt = |flag: &str| {
                args.iter()
                    .position(|a| a == flag)
                    .and_then(|i| args.get(i + 1))
                    .cloned()
                    .unwrap_or_default()
            };
            let seed = opt("--seed").parse().unwrap_or(0);
            let rep = guest(&opt("--device"), &opt("--peer"), seed);
            println!("vm_guest: {} passed, {} failed", rep.passed, rep.failed);
            i32::from(rep.failed > 0)
        }
        _ => {
            eprintln!("usage: vm_guest host-fill|host-check FILE SEED | guest --device BDF --peer BDF --seed N");
            2
        }
    };
    std::process::exit(code);
}
