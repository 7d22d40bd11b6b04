//! The two ways to a [`Vmm`]: boot a kernel, or restore a snapshot (in the
//! manner of Firecracker's `build_microvm_for_boot` and
//! `build_microvm_from_snapshot`). Both open every output first, then KVM,
//! then build the machine; a snapshot is checked whole before anything of it
//! runs (docs/snapshot.md). Also the start-up probe that picks how vCPUs
//! single-step.

use std::sync::OnceLock;
use std::time::Instant;
use vm_memory::GuestMemoryBackend;

use kvm_ioctls::Kvm;

use crate::lwp::cpuid::{GuestLwpSupport, LwpFeatures, LwpProfile};
use crate::vmm::boot;
use crate::vmm::config::{HostConfig, RestoreConfig, SupervisorMode, VmConfig};
use crate::vmm::devices::virtio::VirtioBus;
use crate::vmm::error::{VmError, setup};
use crate::vmm::machine::{self, Machine, MachineSpec, Origin, Restored};
use crate::vmm::output::RunOutputs;
use crate::vmm::snapshot::{self, SnapshotError, VmSnapshot, checks};
use crate::vmm::vcpu::native;
use crate::vmm::vcpu::step::StepBackend;
use crate::vmm::vcpu::step_probe;
use crate::vmm::vcpu::vcpu_state;
use crate::vmm::vmm::Vmm;

/// Refuses host settings that need one another.
fn check(host: &HostConfig) -> Result<(), VmError> {
    let plan = &host.snapshots;
    if plan.dir.is_none() && (plan.after.is_some() || plan.on_port) {
        return Err(VmError::Config(
            "a snapshot time or the snapshot port needs a snapshot directory",
        ));
    }
    Ok(())
}

/// How vCPUs step, when the VM offers precise events to a shim guest.
fn backend_for(kvm: &Kvm, profile: LwpProfile, guest: GuestLwpSupport) -> Option<StepBackend> {
    let precise = profile
        .caps()
        .is_some_and(|c| c.supported.intersects(LwpFeatures::IRE | LwpFeatures::BRE));
    (precise && guest == GuestLwpSupport::Shim).then(|| step_backend(kvm))
}

/// A VM that boots `config.kernel`.
pub fn build_for_boot(config: &VmConfig) -> Result<Vmm, VmError> {
    check(&config.host)?;
    let (console, outputs) = RunOutputs::open(&config.host, config.profile)?;
    let kvm = machine::open_kvm()?;
    let spec = MachineSpec {
        memory_mib: config.memory_mib,
        vcpus: config.vcpus,
        profile: config.profile,
        guest: config.guest,
    };
    let mut machine = machine::create(
        &kvm,
        spec,
        console,
        &Origin::Boot,
        backend_for(&kvm, config.profile, config.guest),
    )?;
    let virtio = VirtioBus::create(
        &machine.vm,
        &config.disks,
        &config.nets,
        config.vsock.as_ref(),
        config.entropy.as_ref(),
    )?;
    let mut cmdline = config.cmdline.clone();
    if let Some(program) = &config.program {
        let entry = boot::load_program(&machine.mem, program)?;
        cmdline = format!("{cmdline} entry={entry}").trim().to_owned();
    }
    boot_kernel(
        &mut machine,
        &config.kernel,
        &cmdline,
        Some(&virtio),
        config.initramfs.as_deref(),
        config.host.supervisor,
    )?;
    Vmm::new(machine, virtio, outputs, &config.host)
}

/// Loads a kernel, writes its boot information and sets the boot vCPU's
/// registers. The virtio devices go where the kernel looks for them: on its
/// command line (`virtio_mmio.device=`) when it names that parameter, as
/// the project's kernel does, else in the DSDT, as a distribution kernel
/// finds them.
/// The supervisor mode is resolved here, where the kernel is known: in
/// native mode every vCPU gets its page before it first runs.
fn boot_kernel(
    machine: &mut Machine,
    image: &[u8],
    cmdline: &str,
    virtio: Option<&VirtioBus>,
    initramfs: Option<&[u8]>,
    supervisor: SupervisorMode,
) -> Result<(), VmError> {
    let (mem, vcpus) = (&machine.mem, machine.spec.vcpus);
    let boot_vcpu = machine.vcpus[0].kvm_fd();
    let mut kernel = boot::load_kernel(mem, image)?;
    kernel.native = supervisor.resolve(
        native::host_offers(boot_vcpu),
        kernel.native,
        vcpus,
        native::MAX_VCPUS,
    )?;
    machine.native = kernel.native;
    if kernel.native {
        for (index, vcpu) in (0u8..).zip(&machine.vcpus) {
            // The kernel's CPUID shows the host's leaves in the mode: it
            // reads the VM's, LWP's and lwpvmm's included, in its page.
            native::write_info(&machine.mem, index, vcpu.cpuid())?;
            native::enable(vcpu.kvm_fd(), index)?;
        }
        log::info!(
            "the guest kernel runs in the host's native supervisor mode (--supervisor {})",
            match supervisor {
                SupervisorMode::Native => "native",
                _ => "auto",
            }
        );
    }
    // Our kernel run emulated on kvm_pvm needs words a user's line (a
    // Firecracker client's `boot_args`) may lack: added, and said once.
    let cmdline = match host_words_for(&kernel, image, cmdline) {
        added if added.is_empty() => cmdline.to_owned(),
        added => {
            log::info!(
                "added `{}` to the kernel command line: this host's KVM emulates the guest's CPL0, where our kernel needs them (docs/linux-guest.md, \"The command line\")",
                added.join(" ")
            );
            format!("{cmdline} {}", added.join(" ")).trim().to_owned()
        }
    };
    let cmdline = cmdline.as_str();
    let (cmdline, devices) = match virtio {
        Some(virtio) if kernel.cmdline_devices => {
            let line = format!("{cmdline} {}", virtio.cmdline());
            (line.trim().to_owned(), Vec::new())
        }
        Some(virtio) => (cmdline.to_owned(), virtio.acpi_devices()),
        None => (cmdline.to_owned(), Vec::new()),
    };
    boot::write_boot_info(mem, &kernel, &cmdline, initramfs, vcpus, &devices)?;
    boot::write_gdt(mem)?;
    let sregs = boot_vcpu.get_sregs().map_err(setup("KVM_GET_SREGS"))?;
    let (regs, sregs) = boot::initial_state(kernel.entry, sregs);
    boot_vcpu
        .set_sregs(&sregs)
        .map_err(setup("KVM_SET_SREGS"))?;
    boot_vcpu.set_regs(&regs).map_err(setup("KVM_SET_REGS"))
}

/// What [`boot::host_words`] adds for `kernel`: only for our own build, run
/// emulated, on kvm_pvm.
fn host_words_for(kernel: &boot::LoadedKernel, image: &[u8], cmdline: &str) -> Vec<&'static str> {
    if kernel.native || !boot::is_our_build(image) || !crate::vmm::config::host_is_kvm_pvm() {
        return Vec::new();
    }
    boot::host_words(cmdline)
}

/// A VM resumed from the snapshot in `config.dir`. Everything in it is
/// checked before any vCPU runs.
pub fn build_from_snapshot(config: &RestoreConfig) -> Result<Vmm, VmError> {
    check(&config.host)?;
    let started = Instant::now();
    // The newest state file says everything but memory; memory is the
    // chain's full snapshot with each diff on top, oldest first.
    let (snap, state_crc, mut parents) = snapshot::chain(&config.dir)?;
    let base = parents.pop();
    let (memory_dir, memory_layout) = match &base {
        Some(link) => (
            link.dir.clone(),
            snapshot::read_link(link, &snap.memory)?.memory,
        ),
        None => (config.dir.clone(), snap.memory.clone()),
    };
    if let Some(asked) = config.profile
        && asked != snap.profile
    {
        return Err(SnapshotError::ProfileMismatch {
            snapshot: snap.profile,
            asked,
        }
        .into());
    }
    let (console, outputs) = RunOutputs::open(&config.host, snap.profile)?;
    let vcpus = checks::vcpu_count(&snap)?;
    let kvm = machine::open_kvm()?;
    checks::cpuid_matches(&machine::supported_cpuid(&kvm)?, &snap, vcpus)?;
    let spec = MachineSpec {
        memory_mib: snap.memory.regions.iter().map(|r| r.1).sum::<u64>() >> 20,
        vcpus,
        profile: snap.profile,
        guest: snap.guest,
    };
    let memory_file = snapshot::open_memory(&memory_dir, &memory_layout)?;
    crate::vmm::base::signals::exit_on_memory_file_sigbus().map_err(|e| VmError::Signal {
        what: "SIGBUS",
        source: e.into(),
    })?;
    let saved: Vec<_> = snap.vcpus.iter().map(|v| v.lwp.as_ref()).collect();
    let origin = Origin::Restore(Restored {
        memory_file: &memory_file,
        serial: &snap.serial,
        pm: snap.pm,
        ioapic: &snap.ioapic,
        lwp: &saved,
    });
    let mut machine = machine::create(
        &kvm,
        spec,
        console,
        &origin,
        backend_for(&kvm, snap.profile, snap.guest),
    )?;
    snapshot::check_layout(&machine.mem, &memory_layout)?;
    if config.verify {
        snapshot::verify_memory(&machine.mem, &memory_layout)?;
    }
    if base.is_some() {
        // Oldest first, one parent's state held at a time.
        for link in parents.iter().rev() {
            let diff = snapshot::read_link(link, &snap.memory)?;
            snapshot::apply_diff(&link.dir, &machine.mem, &diff.memory)?;
        }
        snapshot::apply_diff(&config.dir, &machine.mem, &snap.memory)?;
    }
    // What restore wrote is the parent's content, not a change since.
    for region in machine.mem.iter() {
        vm_memory::MmapRegion::bitmap(region).reset();
    }
    machine.native = restored_native(&snap, config.host.supervisor, machine.vcpus[0].kvm_fd())?;
    for (vcpu, saved) in machine.vcpus.iter_mut().zip(&snap.vcpus) {
        checks::lwpcb_reachable(&machine.mem, vcpu, saved)?;
        vcpu_state::apply(vcpu.kvm_fd(), saved, machine.xsave_size)
            .map_err(|e| VmError::VcpuState(saved.id, e))?;
    }
    snap.vm.apply(&machine.vm)?;
    let virtio = VirtioBus::restore(&machine.vm, &snap.devices, &machine.mem, &config.overrides)?;
    log::info!(
        "snapshot {} restored in {:.1} ms",
        config.dir.display(),
        started.elapsed().as_secs_f64() * 1e3
    );
    let mut vmm = Vmm::new(machine, virtio, outputs, &config.host)?;
    vmm.parent = Some(snapshot::ParentRef {
        dir: std::path::absolute(&config.dir).map_err(|e| {
            snapshot::SnapshotError::Memory(format!("{}: {e}", config.dir.display()))
        })?,
        state_crc,
    });
    Ok(vmm)
}

/// Whether a snapshot's VM ran in native supervisor mode (its vCPUs saved
/// the mode's MSR, each checked to name that vCPU's own page), and
/// whether it may resume so here: `--supervisor` must not ask for the
/// other mode, and a native one needs the host's mode.
fn restored_native(
    snap: &VmSnapshot,
    supervisor: SupervisorMode,
    vcpu: &kvm_ioctls::VcpuFd,
) -> Result<bool, VmError> {
    let mut native = false;
    for saved in &snap.vcpus {
        for &(index, value) in &saved.msrs {
            if index == native::MSR_NATIVE {
                native::check_saved(saved.id, value).map_err(SnapshotError::Mismatch)?;
                native |= value != 0;
            }
        }
    }
    match (supervisor, native) {
        (SupervisorMode::Emulated, true) => Err(SnapshotError::Mismatch(
            "the snapshot's kernel runs in native supervisor mode, which --supervisor emulated refuses".into(),
        )
        .into()),
        (SupervisorMode::Native, false) => Err(SnapshotError::Mismatch(
            "the snapshot's kernel runs emulated, not in the native supervisor mode --supervisor native asks for".into(),
        )
        .into()),
        (_, true) if !native::host_offers(vcpu) => Err(VmError::NativeRefused(
            crate::vmm::config::NativeRefusal::HostLacks,
        )),
        _ => Ok(native),
    }
}

/// Which stepping backend this host supports, probed once per process with
/// a throwaway VM (capabilities cannot tell: kvm_pvm reports
/// SET_GUEST_DEBUG and ROBUST_SINGLESTEP yet never exits for CPL3 steps).
fn step_backend(kvm: &Kvm) -> StepBackend {
    static BACKEND: OnceLock<StepBackend> = OnceLock::new();
    *BACKEND.get_or_init(|| {
        let backend = probe_step_backend(kvm).unwrap_or_else(|e| {
            log::warn!("stepping probe failed ({e}); using the trap-flag backend");
            StepBackend::TrapFlag
        });
        log::info!("precise events: the {} stepping backend", backend.name());
        backend
    })
}

/// Boots the `stepprobe` guest on a throwaway VM and reads the backend from
/// it (vcpu::step_probe).
fn probe_step_backend(kvm: &Kvm) -> Result<StepBackend, VmError> {
    let spec = MachineSpec {
        memory_mib: boot::MIN_MEMORY_MIB,
        vcpus: 1,
        profile: LwpProfile::Off,
        guest: GuestLwpSupport::Stock,
    };
    let mut machine = machine::create(kvm, spec, Box::new(std::io::sink()), &Origin::Boot, None)?;
    let probe = crate::guests::get("stepprobe").unwrap_or_default();
    boot_kernel(
        &mut machine,
        probe,
        "",
        None,
        None,
        SupervisorMode::Emulated,
    )?;
    Ok(step_probe::watch(machine.vcpus[0].kvm())?)
}
