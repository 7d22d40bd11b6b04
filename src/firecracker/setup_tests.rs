//! setup.rs's tests.

use super::*;

#[test]
fn a_tap_is_looked_for_when_it_is_put() {
    let dir = crate::hostfs::TempDir::new("lwpvmm-setup-taps").unwrap();
    let interfaces = dir.path().join("net");
    for (name, flags) in [
        ("tap0", Some("0x1002\n")),
        ("tun0", Some("0x1001\n")),
        ("odd0", Some("garbage\n")),
        ("eth0", None),
    ] {
        std::fs::create_dir_all(interfaces.join(name)).unwrap();
        if let Some(flags) = flags {
            std::fs::write(interfaces.join(name).join("tun_flags"), flags).unwrap();
        }
    }
    // (interfaces, tap, None when taken or the refusal's words)
    let table = [
        (&interfaces, "tap0", None),
        (
            &interfaces,
            "nosuch0",
            Some("no network interface of that name"),
        ),
        (&interfaces, "tun0", Some("a tun device")),
        (&interfaces, "eth0", Some("not a tap")),
        // Flags it cannot read do not say it is no tap: the start tells.
        (&interfaces, "odd0", None),
        (&interfaces, "..", Some("a tap's name is")),
        (&interfaces, "a/b", Some("a tap's name is")),
        (&interfaces, "sixteen-bytes-xx", Some("a tap's name is")),
        // No sysfs to look in: the start alone checks.
        (&dir.path().join("none"), "nosuch0", None),
    ];
    for (at, tap, refused) in table {
        let mut setup = Setup {
            interfaces: at.clone(),
            ..Setup::default()
        };
        let got = setup.network(
            "eth0",
            NetworkInterface {
                iface_id: "eth0".into(),
                host_dev_name: tap.into(),
                guest_mac: None,
                mtu: None,
                rx_rate_limiter: None,
                tx_rate_limiter: None,
            },
        );
        match (got, refused) {
            (Ok(()), None) => assert_eq!(setup.nets.len(), 1, "{tap}"),
            (Err(e), Some(words)) => {
                let text = e.to_string();
                assert!(text.contains(words), "{tap}: {text}");
                assert!(setup.nets.is_empty(), "{tap}");
            }
            (got, want) => panic!("{tap}: {got:?}, expected {want:?}"),
        }
    }
}

#[test]
fn every_cache_type_and_io_engine_of_firecracker_is_taken() {
    let dir = crate::hostfs::TempDir::new("lwpvmm-setup-drives").unwrap();
    let image = dir.path().join("disk.img");
    std::fs::write(&image, [0u8; 512]).unwrap();
    // (cache_type, io_engine, None when taken or the refusal's words)
    let table = [
        (None, None, None),
        (Some("Unsafe"), Some("Sync"), None),
        (Some("Writeback"), Some("Async"), None),
        (
            Some("Directsync"),
            None,
            Some("`Directsync` is not Unsafe or Writeback"),
        ),
        (None, Some("Uring"), Some("`Uring` is not Sync or Async")),
    ];
    for (cache, engine, refused) in table {
        let got = Setup::default().drive(
            "d",
            Drive {
                drive_id: "d".into(),
                path_on_host: Some(image.display().to_string()),
                is_root_device: false,
                is_read_only: false,
                partuuid: None,
                cache_type: cache.map(str::to_owned),
                io_engine: engine.map(str::to_owned),
                rate_limiter: None,
                socket: None,
            },
        );
        match (got, refused) {
            (Ok(()), None) => {}
            (Err(e), Some(words)) => assert!(e.to_string().contains(words), "{e}"),
            (got, want) => panic!("{cache:?} {engine:?}: {got:?}, expected {want:?}"),
        }
    }
}

#[test]
fn the_lwp_body_chooses_the_supervisor_mode() {
    // (`supervisor`, the mode, or the refusal's words)
    let table = [
        (None, Ok(SupervisorMode::Auto)),
        (Some("auto"), Ok(SupervisorMode::Auto)),
        (Some("native"), Ok(SupervisorMode::Native)),
        (Some("emulated"), Ok(SupervisorMode::Emulated)),
        (Some("fast"), Err("`fast` is not auto, native or emulated")),
    ];
    for (given, want) in table {
        let mut setup = Setup::default();
        let got = setup
            .lwp(Lwp {
                supervisor: given.map(str::to_owned),
                ..Lwp::default()
            })
            .map(|()| setup.lwp.supervisor)
            .map_err(|e| e.to_string());
        match (got, want) {
            (Ok(mode), Ok(want)) => assert_eq!(mode, want, "{given:?}"),
            (Err(text), Err(want)) => assert!(text.contains(want), "{text}"),
            (got, want) => panic!("{given:?}: {got:?}, expected {want:?}"),
        }
    }
}
