//! The main thread's side of Firecracker's API: what the API thread, under
//! its seccomp allowlist, may not do itself. It opens the files a client
//! named, builds the VM (booted from a [`Setup`], or loaded from a
//! snapshot) and hands the API its handle, or sends the log lines to the
//! file `PUT /logger` names. Requests arrive as [`Launch`] messages; each
//! answer is typed ([`LaunchError`]), never a string.

use std::fs::File;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::Sender;

use thiserror::Error;

use super::setup::{Setup, SetupError, parse_mac};
use crate::hostfs::{self, Fifo, HostFsError, StreamMode};
use crate::profile::objects::read_kernel_symbols;
use crate::profile::sysroot::{Sysroot, SysrootError};
use crate::vmm::api::frontend::Started;
use crate::vmm::config::{
    DeviceOverrides, DiskConfig, EntropyConfig, Fault, NetConfig, SeccompMode, SerialOut,
    SyscallFixupMode, VsockConfig,
};
use crate::vmm::{HostConfig, Profiling, RestoreConfig, SnapshotPlan, VmConfig, VmError, Vmm};

/// Why the main thread could not do what the API asked.
#[derive(Debug, Error)]
pub enum LaunchError {
    /// A file named in the configuration cannot be read.
    #[error("cannot read {what}: {source}")]
    Read {
        /// Which file.
        what: &'static str,
        /// Why (the path is in it).
        source: HostFsError,
    },
    /// The configuration is incomplete.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// The initramfs cannot name a profile's frames.
    #[error("initrd_path: {0}")]
    Sysroot(#[from] SysrootError),
    /// The VM could not be built.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// The log file cannot be used.
    #[error("log_path {0}")]
    Log(HostFsError),
}

impl LaunchError {
    /// Whose fault it was: the client's configuration, or the host's (KVM,
    /// a tap that would not open, a thread).
    pub fn fault(&self) -> Fault {
        match self {
            LaunchError::Vm(e) => e.fault(),
            LaunchError::Read { .. }
            | LaunchError::Setup(_)
            | LaunchError::Sysroot(_)
            | LaunchError::Log(_) => Fault::Request,
        }
    }

    /// The status Firecracker's API answers it with: 400 for the client's
    /// fault (Firecracker answers every one so), 500 for the host's, 503
    /// while lwpvmm stops.
    pub fn status(&self) -> u16 {
        match self.fault() {
            Fault::Request | Fault::Conflict => 400,
            Fault::Stopping => 503,
            Fault::Host => 500,
        }
    }
}

/// A snapshot to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadPlan {
    /// lwpvmm's snapshot directory.
    pub dir: PathBuf,
    /// Track dirty pages, for Diff snapshots of the loaded VM.
    pub track_dirty_pages: bool,
    /// Run at once; else pause it as it starts.
    pub resume: bool,
    /// The taps and vsock socket of this clone.
    pub overrides: DeviceOverrides,
}

/// What the API thread asks of the main thread.
pub enum Launch {
    /// Boot this configuration.
    Boot(Box<Setup>, Sender<Result<Started, LaunchError>>),
    /// Load this snapshot, with this configuration's metrics and LWP
    /// host settings.
    Load(LoadPlan, Box<Setup>, Sender<Result<Started, LaunchError>>),
    /// Append the log lines to this file.
    Logger(PathBuf, Sender<Result<(), LaunchError>>),
}

/// Host settings every VM of the front end shares.
#[derive(Debug, Clone, Copy)]
pub struct HostSettings {
    /// The seccomp filters.
    pub seccomp: SeccompMode,
}

/// Reads the kernel or initrd a client named for a guest of `memory_mib`
/// MiB (`crate::vmm::config::read_image`: a regular file, checked when it is
/// opened here at `InstanceStart`, never a FIFO or a device it could wait
/// on, and no larger than the guest's RAM).
fn read_image(what: &'static str, path: &Path, memory_mib: u64) -> Result<Vec<u8>, LaunchError> {
    crate::vmm::config::read_image(path, memory_mib)
        .map_err(|source| LaunchError::Read { what, source })
}

/// The host side of a VM of this front end, configured as `setup` says.
fn host(settings: HostSettings, setup: &Setup, diff: bool) -> HostConfig {
    let lwp = &setup.lwp;
    let metrics = setup
        .metrics
        .as_ref()
        .map(|m| PathBuf::from(&m.metrics_path));
    HostConfig {
        serial: SerialOut::Stdout,
        snapshots: SnapshotPlan {
            diff,
            ..SnapshotPlan::default()
        },
        seccomp: settings.seccomp,
        stop_on_signals: true,
        profiling: Profiling {
            sample_hz: lwp.sample_hz,
            trace: lwp.trace.clone(),
            metrics,
            ..Profiling::default()
        },
        // The front end's API serves the VM it starts.
        api_served: true,
        syscall_fixup: SyscallFixupMode::Auto,
        supervisor: setup.lwp.supervisor,
    }
}

/// Builds the VM `setup` describes; its handle goes to the API.
pub fn boot(setup: &Setup, settings: HostSettings) -> Result<(Vmm, Started), LaunchError> {
    let boot = setup.boot.as_ref().ok_or(SetupError::NoKernel)?;
    let kernel_path = PathBuf::from(&boot.kernel_image_path);
    let memory_mib = setup.machine.mem_size_mib;
    let kernel = read_image("kernel_image_path", &kernel_path, memory_mib)?;
    let initrd = boot.initrd_path.as_ref().map(PathBuf::from);
    let initramfs = initrd
        .as_deref()
        .map(|p| read_image("initrd_path", p, memory_mib))
        .transpose()?;
    let cmdline = setup.cmdline(|| crate::vmm::config::default_cmdline(&kernel, None))?;
    let nets = setup
        .nets
        .iter()
        .map(|n| {
            Ok(NetConfig {
                id: Some(n.iface_id.clone()),
                tap: n.host_dev_name.clone(),
                mac: n.guest_mac.as_deref().map(parse_mac).transpose()?,
            })
        })
        .collect::<Result<Vec<_>, SetupError>>()?;
    let config = VmConfig {
        kernel,
        initramfs,
        cmdline,
        memory_mib: setup.machine.mem_size_mib,
        vcpus: setup.machine.vcpu_count,
        profile: setup.lwp.profile,
        guest: setup.lwp.guest,
        program: None,
        disks: setup
            .ordered_drives()
            .into_iter()
            .map(|d| DiskConfig {
                path: d.path_on_host.clone().unwrap_or_default().into(),
                read_only: d.is_read_only,
            })
            .collect(),
        nets,
        vsock: setup.vsock.as_ref().map(|v| VsockConfig {
            cid: v.guest_cid,
            uds_path: v.uds_path.clone().into(),
        }),
        entropy: setup.entropy.map(|e| EntropyConfig {
            rate_limit: e.rate_limiter,
        }),
        host: host(settings, setup, setup.machine.track_dirty_pages),
    };
    let sysroot = initrd
        .as_deref()
        .map(Sysroot::open)
        .transpose()?
        .map(Arc::new);
    let kernel_symbols = read_kernel_symbols(&kernel_path)
        .ok()
        .map(|bytes| (kernel_path.display().to_string(), Arc::new(bytes)));
    let vsock = config.vsock.as_ref().map(|v| v.uds_path.clone());
    let fresh = vsock
        .as_deref()
        .is_some_and(|p| p.symlink_metadata().is_err());
    let asynchronous: Vec<&str> = setup
        .drives
        .iter()
        .filter(|d| d.io_engine.as_deref() == Some("Async"))
        .map(|d| d.drive_id.as_str())
        .collect();
    if !asynchronous.is_empty() {
        // Taken rather than refused (bandsox always sends it): the guest
        // sees the same virtio-blk either way. A warning, so that it shows
        // at the level a Firecracker run starts with.
        log::warn!(
            "io_engine Async (drive {}): lwpvmm's block device has one engine, I/O on its device thread (Sync); the drive works as with Sync",
            asynchronous.join(", ")
        );
    }
    let vmm = match crate::vmm::build_for_boot(&config) {
        Ok(vmm) => vmm,
        Err(e) => {
            // The socket the failed build bound (not one that was there
            // before): a second InstanceStart must find the path free.
            if let Some(path) = vsock.filter(|_| fresh) {
                remove_socket(&path);
            }
            return Err(e.into());
        }
    };
    let started = Started {
        vm: vmm.handle(),
        sysroot,
        kernel: kernel_symbols,
    };
    Ok((vmm, started))
}

/// Builds the VM a snapshot holds; its handle goes to the API.
pub fn load(
    plan: &LoadPlan,
    setup: &Setup,
    settings: HostSettings,
) -> Result<(Vmm, Started), LaunchError> {
    let config = RestoreConfig {
        dir: plan.dir.clone(),
        profile: None,
        verify: false,
        overrides: plan.overrides.clone(),
        host: host(settings, setup, plan.track_dirty_pages),
    };
    let vmm = crate::vmm::build_from_snapshot(&config)?;
    let started = Started {
        vm: vmm.handle(),
        sysroot: None,
        kernel: None,
    };
    if !plan.resume {
        // Queued before the VM runs: the control thread, which starts
        // after the vCPUs, pauses it as its first request (the guest may
        // run for that moment, where Firecracker's would not run at all).
        let vm = started.vm.clone();
        std::thread::spawn(move || {
            let _ = vm.pause();
        });
    }
    Ok((vmm, started))
}

/// Removes `path` if it is a socket.
fn remove_socket(path: &Path) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Opens the log file `PUT /logger` or `--log-path` names: a regular file
/// (appended to, never followed through a symbolic link) or a FIFO a
/// reader holds open (`crate::hostfs::open_stream`).
pub fn open_log(path: &Path) -> Result<File, LaunchError> {
    hostfs::open_stream(path, StreamMode::Append, Fifo::Allowed).map_err(LaunchError::Log)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmm::config::{BootError, VirtioError};

    #[test]
    fn a_clients_mistake_answers_400_and_the_hosts_500() {
        let io = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        // (what, the error, the status)
        let table: Vec<(&str, LaunchError, u16)> = vec![
            (
                "no kernel",
                SetupError::Invalid {
                    field: "kernel_image_path",
                    why: "missing".into(),
                }
                .into(),
                400,
            ),
            (
                "guest memory out of range",
                VmError::Boot(BootError::MemorySize {
                    mib: 1,
                    min: 16,
                    max: 1 << 20,
                })
                .into(),
                400,
            ),
            (
                "a disk image of odd size",
                VmError::Virtio(VirtioError::DiskSize {
                    path: "/x.img".into(),
                    bytes: 100,
                })
                .into(),
                400,
            ),
            (
                "a tap that would not open",
                VmError::Virtio(VirtioError::Tap {
                    tap: "tap0".into(),
                    source: io(),
                })
                .into(),
                500,
            ),
            (
                "KVM lacking a capability",
                VmError::MissingCap("KVM_CAP_X").into(),
                500,
            ),
            (
                "a thread that would not start",
                VmError::Thread {
                    what: "device",
                    source: io(),
                }
                .into(),
                500,
            ),
        ];
        for (what, e, status) in table {
            assert_eq!(e.status(), status, "{what}: {e}");
        }
    }
}
