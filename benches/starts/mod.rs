//! `cargo bench --bench vmm -- starts`: process start to exit under lwpvmm
//! against the bare floor (a VM and a vCPU that run one instruction), and the
//! minimal guest against QEMU's microvm when installed. Shared helpers are the
//! bench root's (vmm.rs).

use super::*;

const STARTS: usize = 20;

/// Milliseconds from spawning `args` to its exit, with `env` set; it must
/// exit with `status`.
fn wall_ms(args: &[&str], env: Option<(&str, &str)>, status: i32) -> f64 {
    let mut cmd = Command::new(args[0]);
    cmd.args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    let started = Instant::now();
    let done = cmd.status().expect("spawn");
    let ms = started.elapsed().as_secs_f64() * 1e3;
    assert_eq!(done.code(), Some(status), "{args:?}");
    ms
}

/// QEMU microvm followed by `extra`: the start-up comparison's machine.
fn qemu_microvm(extra: &[&str]) -> Vec<String> {
    qemu("microvm,x-option-roms=off,rtc=off", extra)
}

/// A 64-bit ELF kernel whose first instruction exits through the exit port
/// (lwpvmm's 64-bit entry: long mode, identity-mapped), the guest of the
/// bare harness's kind: the start-up ratio then compares VMMs, not guests.
fn exit_at_once_elf() -> Vec<u8> {
    const BASE: u64 = 0x10_0000;
    const EHDR: u64 = 64;
    const PHDR: u64 = 56;
    // mov $0, %al; out %al, $0xf4; hlt
    let code = [0xb0, 0x00, 0xe6, 0xf4, 0xf4];
    let entry = BASE + EHDR + PHDR;
    let size = EHDR + PHDR + code.len() as u64;
    let mut elf = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
    elf.resize(16, 0);
    let half = |v: u16| v.to_le_bytes().to_vec();
    let word = |v: u32| v.to_le_bytes().to_vec();
    let quad = |v: u64| v.to_le_bytes().to_vec();
    for field in [
        half(2),    // ET_EXEC
        half(0x3e), // x86-64
        word(1),
        quad(entry),
        quad(EHDR), // program headers
        quad(0),    // no section headers
        word(0),
        half(EHDR as u16),
        half(PHDR as u16),
        half(1),
        half(0),
        half(0),
        half(0),
    ] {
        elf.extend(field);
    }
    for field in [
        word(1), // PT_LOAD
        word(5), // R+X
        quad(0),
        quad(BASE),
        quad(BASE),
        quad(size),
        quad(size),
        quad(0x1000),
    ] {
        elf.extend(field);
    }
    elf.extend(code);
    elf
}

pub fn starts() {
    let minimal = embedded_guest("minimal");
    let at_once = guest_file("exit", &exit_at_once_elf());
    let lwpvmm_bin = env!("CARGO_BIN_EXE_lwpvmm");
    let run = |kernel: &PathBuf| -> Vec<String> {
        [
            lwpvmm_bin,
            "run",
            "--kernel",
            kernel.to_str().unwrap(),
            "--memory",
            "64",
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let (lwpvmm_minimal, lwpvmm_at_once) = (run(&minimal), run(&at_once));
    let qemu_args = qemu_microvm(&[
        "-device",
        "isa-debug-exit,iobase=0xf4,iosize=0x04",
        "-kernel",
        minimal.to_str().unwrap(),
    ]);
    let me = std::env::current_exe().expect("the bench binary");
    let bare: Vec<&str> = vec![me.to_str().expect("UTF-8 path")];
    fn args(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    // Interleaved, so that a slow spell of the host weighs on all alike.
    let (mut at_once_ms, mut minimal_ms, mut qemu_ms) = (Vec::new(), Vec::new(), Vec::new());
    let kinds = [Bare::Plain, Bare::Irqchip, Bare::Split];
    let mut bare_ms: [Vec<f64>; 3] = Default::default();
    let qemu = has_qemu();
    for _ in 0..STARTS {
        at_once_ms.push(wall_ms(&args(&lwpvmm_at_once), None, 1));
        minimal_ms.push(wall_ms(&args(&lwpvmm_minimal), None, 1));
        for (kind, times) in kinds.iter().zip(bare_ms.iter_mut()) {
            times.push(wall_ms(&bare, Some(("BARE_VM", kind.env())), 0));
        }
        if qemu {
            qemu_ms.push(wall_ms(&args(&qemu_args), None, 1));
        }
    }
    let (lw, lm) = (median(at_once_ms), median(minimal_ms));
    let [bw, iw, sw] = bare_ms.map(median);
    println!(
        "process start to exit ({STARTS} runs each, interleaved, median wall by the monotonic clock):"
    );
    println!("  lwpvmm, a guest that exits at once {lw:>8.2} ms");
    println!("  lwpvmm, the minimal guest          {lm:>8.2} ms  (it prints a line first)");
    println!("  bare harness: VM, vCPU, one HLT    {bw:>8.2} ms");
    println!("  the same + a split irqchip         {sw:>8.2} ms  (lwpvmm's irqchip)");
    println!("  the same + KVM's irqchip and PIT   {iw:>8.2} ms  (what lwpvmm no longer has)");
    println!("start lwpvmm/bare harness = {:.2}", lw / bw);
    println!(
        "start lwpvmm/bare harness with a split irqchip = {:.2}",
        lw / sw
    );
    println!("start lwpvmm minimal guest/bare harness = {:.2}", lm / bw);
    if qemu {
        let qw = median(qemu_ms);
        println!("  qemu -M microvm, the minimal guest {qw:>8.2} ms");
        println!("start lwpvmm/qemu = {:.2}", lm / qw);
    } else {
        println!("start lwpvmm/qemu = not measured (apt-get install qemu-system-x86)");
    }
    let _ = std::fs::remove_file(minimal);
    let _ = std::fs::remove_file(at_once);
}
