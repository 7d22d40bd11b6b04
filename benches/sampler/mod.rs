//! `cargo bench --bench vmm -- sampler`: the sampler's cost per kick against
//! the bare exit it cannot go below, piece by piece, and a sample with its call
//! stack against one without. Shared helpers are the bench root's (vmm.rs).

use super::*;

/// The sampler's cost against its floor, measured in one run: the bare exit
/// (a CPL3 port-I/O round trip, the cheapest exit to lwpvmm) is what a kick
/// cannot go below; the rest of a kick is shown piece by piece.
pub fn sampler() {
    const DEFAULT_INTERVAL: u32 = 0x1ff_ffff;
    const SMALL_INTERVAL: u32 = 0xffff;
    let hz = tsc_hz();
    let bare_exit = round_trip_cycles()[1];
    // The fastest of three runs each: host noise only ever slows a run.
    let best = |hz: u32, interval: Option<u32>, trace: Option<bool>| {
        (0..3)
            .map(|_| throughput(hz, interval, trace))
            .min_by(|a, b| a.cycles.total_cmp(&b.cycles))
            .expect("three runs")
    };
    let off = best(0, Some(DEFAULT_INTERVAL), None);
    let unarmed = throughput(1000, None, None);
    let k1 = best(1000, Some(DEFAULT_INTERVAL), None);
    let per_kick = (k1.cycles - off.cycles) / k1.kicks.max(1) as f64;
    let in_lwpvmm = k1.sampler_ns as f64 * hz / 1e9 / k1.kicks.max(1) as f64;
    println!(
        "sampler at 1 kHz (guest TSC cycles; TSC {:.0} MHz): {} kicks; an unarmed guest got {}",
        hz / 1e6,
        k1.kicks,
        unarmed.kicks
    );
    println!("  CPL3 throughput lost per kick          {per_kick:>10.0}");
    println!("  bare exit (CPL3 port-I/O round trip)   {bare_exit:>10.0}");
    println!("  in lwpvmm after KVM_RUN returns        {in_lwpvmm:>10.0}  (charge, stack, trace)");
    println!(
        "  the rest                               {:>10.0}  (the kick signal, and KVM's exit and entry beyond a port exit's)",
        per_kick - bare_exit - in_lwpvmm
    );
    println!(
        "charged kick / bare kick exit = {:.2}",
        per_kick / bare_exit
    );
    let loss = k1.cycles / off.cycles - 1.0;
    println!(
        "1 kHz loss / (rate x bare exit cost) = {:.2}  (loss {:.2}%)",
        loss / (1000.0 * bare_exit / hz),
        100.0 * loss
    );
    // Every kick stores a record (a small interval) into a trace.
    let cost = |t: &Throughput| (t.cycles - off.cycles) / t.kicks.max(1) as f64;
    let with = best(10_000, Some(SMALL_INTERVAL), Some(true));
    let without = best(10_000, Some(SMALL_INTERVAL), Some(false));
    println!(
        "  10 kHz, a traced record per kick: {:.0} cycles per kick with its stack, {:.0} without",
        cost(&with),
        cost(&without)
    );
    println!(
        "sample with stack / without = {:.2}",
        cost(&with) / cost(&without)
    );
    let (plain, captured, samples) = capture_loss(off.cycles / hz);
    println!(
        "  a pprof request over the API socket, 1 kHz with a record and its stack per kick: loop {:.0} M cycles without, {:.0} M during the capture ({samples} samples in the profile)",
        plain / 1e6,
        captured / 1e6
    );
    println!(
        "pprof request: CPL3 throughput loss during a 5 s capture = {:.2}%",
        100.0 * (captured / plain - 1.0)
    );
}

/// The throughput guest's loop under the sampler at 1 kHz, every kick a
/// record, with the control API on: once alone, once while a client's
/// `GET /debug/pprof/profile?seconds=5` captures it (the loop is sized to
/// end inside the capture; the VM's end answers the request). The fastest
/// of three each, and the profile's sample count.
fn capture_loss(seconds_per_billion: f64) -> (f64, f64, i64) {
    use std::io::{Read, Write};
    // A loop of about 2.5 s unloaded, inside the 5 s capture even when
    // the kicks and a busy host slow it by half.
    let work = (2.5e9 / seconds_per_billion) as u64;
    let run = |capture: bool| -> (f64, i64) {
        let console = Arc::new(Mutex::new(Vec::new()));
        let sock = std::env::temp_dir().join(format!(
            "lwpvmm-bench-api-{}-{capture}.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&sock);
        let mut host = captured(
            &console,
            Profiling {
                sample_hz: 1000,
                ..Profiling::default()
            },
        );
        host.api_served = true;
        let config = VmConfig {
            kernel: lwpvmm::guests::get("throughput").expect("guest").to_vec(),
            cmdline: format!("lwp=1 interval=65535 work={work}"),
            memory_mib: 64,
            host,
            ..VmConfig::default()
        };
        let client = capture.then(|| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                let mut s = loop {
                    match std::os::unix::net::UnixStream::connect(&sock) {
                        Ok(s) => break s,
                        Err(_) if started.elapsed() < Duration::from_secs(10) => {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err(e) => panic!("the API socket: {e}"),
                    }
                };
                s.write_all(b"GET /debug/pprof/profile?seconds=5 HTTP/1.1\r\nHost: b\r\n\r\n")
                    .expect("the request");
                let mut answer = Vec::new();
                s.read_to_end(&mut answer).expect("the answer");
                let at = answer
                    .windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .expect("an HTTP answer");
                let p = lwpvmm::profile::pprof::read(&answer[at + 4..]).expect("a profile");
                // The records: the values of the count types, not the time.
                let counts: Vec<usize> = p
                    .sample_type
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| p.string_table[t.unit as usize] == "count")
                    .map(|(i, _)| i)
                    .collect();
                p.sample
                    .iter()
                    .map(|s| counts.iter().map(|&i| s.value[i]).sum::<i64>())
                    .sum()
            })
        });
        let listeners = lwpvmm::vmm::api::ApiListeners::bind(&lwpvmm::vmm::api::ApiConfig {
            sock: Some(sock.clone()),
            ..Default::default()
        })
        .expect("the API socket")
        .expect("listeners");
        let vm = vmm::build_for_boot(&config).expect("throughput guest");
        let started = lwpvmm::vmm::api::frontend::Started {
            vm: vm.handle(),
            sysroot: None,
            kernel: None,
        };
        let api = listeners
            .start(
                lwpvmm::vmm::api::ApiPhase::Running {
                    started,
                    frontend: None,
                },
                config.host.seccomp,
            )
            .expect("the API");
        vm.run().expect("throughput guest");
        api.finish();
        let samples = client.map_or(0, |c| c.join().expect("the pprof client"));
        let text = String::from_utf8_lossy(&console.lock().unwrap()).into_owned();
        let cycles = text
            .lines()
            .find_map(|l| l.strip_prefix("throughput "))
            .expect("result")
            .trim()
            .parse()
            .unwrap();
        (cycles, samples)
    };
    let best = |capture: bool| {
        (0..3)
            .map(|_| run(capture))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .expect("three runs")
    };
    let (plain, _) = best(false);
    let (with, samples) = best(true);
    (plain, with, samples)
}
