//! Builds lwpvmm's own guests (resources/guests) with the machine's gcc and
//! GNU ld, so the binary can embed them: each guest is the shared runtime,
//! the CPL3 library and one program, linked into a PVH-bootable ELF.

// A build script stops the build with its message on any failure: that
// is what its unwraps are for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The guests: the demo, a minimal one for start-up benchmarks, and the
/// integration-test guests.
const GUESTS: &[&str] = &[
    "demo",
    "minimal",
    "cpuid",
    "msr",
    "insn",
    "bad_lwpcb",
    "threshold",
    "unhandled",
    "roundtrip",
    "smp",
    "twotask",
    "replay",
    "hostile",
    "pt_race",
    "sample_as",
    "throughput",
    "precise",
    "stepping",
    "tfstep",
    "stepprobe",
    "profile_host",
    "cplprobe",
    "privilege",
    "pku",
    "virtio_hostile",
    "compat32",
    "kernel_insn",
    "reserved_bits",
];

/// Guests that share another guest's CPL0 part: (guest, assembly source).
/// Guests written for the host's native supervisor mode: their own entry
/// and link script (a 64-bit entry and the lwpvmm note), no shared runtime.
const NATIVE_GUESTS: &[&str] = &["native"];

const SHARED_KERNEL: &[(&str, &str)] = &[("sample_as", "twotask.S")];

const CFLAGS: &[&str] = &[
    "-m64",
    "-O2",
    "-std=gnu11",
    "-Wall",
    "-Werror",
    "-ffreestanding",
    "-fno-pic",
    "-fno-pie",
    "-fno-stack-protector",
    "-fno-asynchronous-unwind-tables",
    // The host-side trace unwinds guest stacks by frame pointers.
    "-fno-omit-frame-pointer",
    "-fcf-protection=none",
    "-mno-red-zone",
    "-mgeneral-regs-only",
    "-mlwp",
];

fn run(cmd: &mut Command) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (install gcc and binutils)"));
    assert!(status.success(), "{cmd:?} failed with {status}");
}

fn compile(src: &Path, out: &Path) {
    run(Command::new("gcc")
        .args(CFLAGS)
        .arg("-c")
        .arg(src)
        .arg("-o")
        .arg(out));
}

/// Links guest `name` from `objects` with the link script `script` and
/// adds it to the table of embedded guests.
fn link(script: &Path, out: &Path, name: &str, objects: &[PathBuf], table: &mut String) {
    let elf = out.join(format!("{name}.elf"));
    run(Command::new("ld")
        .args([
            "-m",
            "elf_x86_64",
            "-nostdlib",
            "--no-warn-rwx-segments",
            "-T",
        ])
        .arg(script)
        .arg("-o")
        .arg(&elf)
        .args(objects));
    writeln!(
        table,
        "    ({name:?}, include_bytes!({:?})),",
        elf.display().to_string()
    )
    .unwrap();
}

fn main() {
    let dir = PathBuf::from("resources/guests");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("guests");
    fs::create_dir_all(&out).expect("create guest output dir");
    println!("cargo:rerun-if-changed={}", dir.display());

    let runtime = out.join("runtime.o");
    compile(&dir.join("runtime.S"), &runtime);
    let lib = out.join("lib.o");
    compile(&dir.join("lib.c"), &lib);

    let mut table = String::new();
    for name in GUESTS {
        let mut objects = vec![runtime.clone(), lib.clone()];
        let shared = SHARED_KERNEL
            .iter()
            .filter(|(g, _)| g == name)
            .map(|(_, s)| dir.join(s));
        let own = ["c", "S"].map(|ext| dir.join(format!("{name}.{ext}")));
        for (i, src) in own
            .into_iter()
            .filter(|p| p.exists())
            .chain(shared)
            .enumerate()
        {
            let obj = out.join(format!("{name}_{i}.o"));
            compile(&src, &obj);
            objects.push(obj);
        }
        link(&dir.join("guest.ld"), &out, name, &objects, &mut table);
    }
    for name in NATIVE_GUESTS {
        let objects: Vec<PathBuf> = ["S", "c"]
            .iter()
            .map(|ext| {
                let obj = out.join(format!("{name}_{ext}.o"));
                compile(&dir.join(format!("{name}.{ext}")), &obj);
                obj
            })
            .collect();
        link(&dir.join("native.ld"), &out, name, &objects, &mut table);
    }
    // The example program for `lwpvmm profile` (no runtime: freestanding).
    let examples = PathBuf::from("resources/examples");
    println!("cargo:rerun-if-changed={}", examples.display());
    let hot_o = out.join("example_hot.o");
    compile(&examples.join("hot.c"), &hot_o);
    let hot = out.join("example_hot.elf");
    // Linked as the README tells a user to link it: program.ld has no
    // writable and executable segment, so ld warns of none.
    run(Command::new("ld")
        .args(["-m", "elf_x86_64", "-nostdlib", "-T"])
        .arg(examples.join("program.ld"))
        .arg("-o")
        .arg(&hot)
        .arg(&hot_o));
    writeln!(
        table,
        "    (\"example-hot\", include_bytes!({:?})),",
        hot.display().to_string()
    )
    .unwrap();
    fs::write(
        out.join("guests.rs"),
        format!(
            "/// Every embedded guest, by name.\npub const ALL: &[(&str, &[u8])] = &[\n{table}];\n"
        ),
    )
    .expect("write guests.rs");
}
