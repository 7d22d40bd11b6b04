//! The device thread: an event-manager loop over every virtio queue's
//! ioeventfd and every tap, so device I/O never runs on a vCPU thread. It
//! installs its own seccomp allowlist before it touches a queue. The control
//! thread pauses it (after the vCPUs, before a snapshot reads device state
//! and guest memory), resumes it and stops it through a channel and an
//! eventfd, the way it drives vCPUs.

use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use event_manager::{EventManager, EventOps, Events, MutEventSubscriber, SubscriberOps};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK;

use super::bus::{Slot, VirtioBus};
use super::device::VirtioError;
use super::mmio::{Halt, MmioTransport, Progress};
use crate::guard::GuestMemory;
use crate::guest_warn;
use crate::vmm::base::control_error::ControlError;
use crate::vmm::base::metrics::DeviceMetrics;
use crate::vmm::base::seccomp::{self, SeccompMode, ThreadKind};

/// What the control thread asks of the device thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEvent {
    /// Finish the request at hand and wait for `Resume` or `Finish`.
    Pause,
    /// Carry on.
    Resume,
    /// Stop.
    Finish,
}

/// The event data of the wake eventfd.
const WAKE: u32 = u32::MAX;
/// Tap events carry this bit and the slot's index; queue notifications
/// carry the slot's index << 16 | the queue's.
const TAP: u32 = 1 << 31;

/// A raw descriptor the loop polls (a tap, owned by its device).
struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// One device as the loop sees it.
struct Device {
    transport: Arc<Mutex<MmioTransport>>,
    notify: Vec<EventFd>,
    tap: Option<RawFd>,
    polling: bool,
    metrics: Arc<DeviceMetrics>,
}

struct Loop {
    devices: Vec<Device>,
    mem: Arc<GuestMemory>,
    wake: EventFd,
    events: Receiver<DeviceEvent>,
    replies: Sender<DeviceEvent>,
    stop: bool,
    halt: Halt,
}

impl Loop {
    /// Applies what a request path said about polling the device's tap.
    fn poll_tap(&mut self, slot: usize, progress: Progress, ops: &mut EventOps) {
        let Some(device) = self.devices.get_mut(slot) else {
            return;
        };
        let (Some(fd), Some(want)) = (device.tap, progress.host_input) else {
            return;
        };
        if want != device.polling {
            let events = Events::with_data(&Fd(fd), TAP | slot as u32, EventSet::IN);
            let done = if want {
                ops.add(events)
            } else {
                ops.remove(events)
            };
            if done.is_ok() {
                device.polling = want;
            }
        }
    }

    /// Runs `what` on device `slot` (for a notification of `queue`).
    fn run_device(
        &mut self,
        slot: usize,
        queue: Option<usize>,
        ops: &mut EventOps,
        what: impl FnOnce(
            &mut MmioTransport,
            &GuestMemory,
        ) -> Result<Progress, super::device::DeviceError>,
    ) {
        let Some(device) = self.devices.get(slot) else {
            return;
        };
        let result = match device.transport.lock() {
            Ok(mut t) => what(&mut t, &self.mem),
            Err(_) => return,
        };
        match result {
            Ok(progress) => {
                // Stopped at its limit: come back after the other events.
                if progress.again
                    && let Some(fd) = queue.and_then(|q| self.devices.get(slot)?.notify.get(q))
                {
                    let _ = fd.write(1);
                }
                self.poll_tap(slot, progress, ops)
            }
            Err(e) => {
                guest_warn!(
                    self.devices[slot].metrics.device_errors,
                    "virtio device {slot}: {e}; it needs a reset by the guest"
                );
            }
        }
    }

    /// Answers the control thread; blocks while paused.
    fn control(&mut self) {
        let _ = self.wake.read();
        while let Ok(event) = self.events.try_recv() {
            match event {
                DeviceEvent::Pause => {
                    let _ = self.replies.send(DeviceEvent::Pause);
                    match self.events.recv() {
                        Ok(DeviceEvent::Resume) => {
                            let _ = self.replies.send(DeviceEvent::Resume);
                        }
                        _ => {
                            self.stop = true;
                            return;
                        }
                    }
                }
                DeviceEvent::Resume => {
                    let _ = self.replies.send(DeviceEvent::Resume);
                }
                DeviceEvent::Finish => {
                    self.stop = true;
                    return;
                }
            }
        }
    }
}

impl MutEventSubscriber for Loop {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let data = events.data();
        if events.fd() == self.wake.as_raw_fd() {
            self.control();
            return;
        }
        // A pause asked for while a batch of events was being handled
        // goes first: the event is handled after it.
        if self.halt.requested() {
            self.control();
            if self.stop {
                return;
            }
        }
        if data & TAP != 0 {
            let slot = (data & 0xffff) as usize;
            self.run_device(slot, None, ops, |t, mem| t.host_input(mem));
            return;
        }
        let (slot, queue) = ((data >> 16) as usize, (data & 0xffff) as usize);
        if let Some(fd) = self.devices.get(slot).and_then(|d| d.notify.get(queue)) {
            let _ = fd.read();
        }
        self.run_device(slot, Some(queue), ops, |t, mem| t.notified(queue, mem));
    }

    fn init(&mut self, ops: &mut EventOps) {
        let _ = ops.add(Events::with_data(&self.wake, WAKE, EventSet::IN));
        for (slot, device) in self.devices.iter_mut().enumerate() {
            for (queue, fd) in device.notify.iter().enumerate() {
                let data = (slot as u32) << 16 | queue as u32;
                let _ = ops.add(Events::with_data(fd, data, EventSet::IN));
            }
            if let Some(tap) = device.tap
                && ops
                    .add(Events::with_data(&Fd(tap), TAP | slot as u32, EventSet::IN))
                    .is_ok()
            {
                device.polling = true;
            }
        }
    }
}

/// One running device thread.
struct OneThread {
    events: Sender<DeviceEvent>,
    replies: Receiver<DeviceEvent>,
    wake: EventFd,
    halt: Halt,
    join: Option<JoinHandle<()>>,
}

/// The running device threads: one for the disks and network devices, and
/// one for a vsock device, the only device with host sockets, under an
/// allowlist of its own.
pub struct DeviceThread {
    threads: Vec<OneThread>,
}

impl DeviceThread {
    /// Starts the threads over `bus`'s devices; `None` when there are none.
    pub fn start(
        bus: &VirtioBus,
        mem: Arc<GuestMemory>,
        mode: SeccompMode,
    ) -> Result<Option<Self>, VirtioError> {
        if bus.is_empty() {
            return Ok(None);
        }
        let is_vsock = |s: &&Slot| {
            s.transport
                .lock()
                .is_ok_and(|t| t.device().device_type() == VIRTIO_ID_VSOCK)
        };
        let mut threads = Vec::new();
        let (vsock, others): (Vec<&Slot>, Vec<&Slot>) = bus.slots().iter().partition(is_vsock);
        for (slots, kind, name) in [
            (others, ThreadKind::Device, "lwpvmm-devices"),
            (vsock, ThreadKind::Vsock, "lwpvmm-vsock"),
        ] {
            if !slots.is_empty() {
                threads.push(OneThread::start(
                    &slots,
                    Arc::clone(&mem),
                    mode,
                    kind,
                    name,
                )?);
            }
        }
        Ok(Some(DeviceThread { threads }))
    }

    /// Pauses the threads; returns once all wait.
    pub fn pause(&self) -> Result<(), ControlError> {
        self.threads.iter().try_for_each(OneThread::pause)
    }

    /// Lets paused threads carry on.
    pub fn resume(&self) -> Result<(), ControlError> {
        self.threads.iter().try_for_each(OneThread::resume)
    }

    /// Stops the threads and waits for them.
    pub fn finish(self) -> Result<(), VirtioError> {
        let mut result = Ok(());
        for t in self.threads {
            if let Err(e) = t.finish() {
                result = Err(e);
            }
        }
        result
    }
}

impl OneThread {
    /// Starts a thread over `slots`, under `kind`'s allowlist.
    fn start(
        slots: &[&Slot],
        mem: Arc<GuestMemory>,
        mode: SeccompMode,
        kind: ThreadKind,
        name: &'static str,
    ) -> Result<Self, VirtioError> {
        let err = VirtioError::Thread;
        let wake = EventFd::new(EFD_NONBLOCK).map_err(err)?;
        let halt = Halt::default();
        let mut devices = Vec::new();
        for s in slots {
            if let Ok(mut t) = s.transport.lock() {
                t.set_halt(halt.clone());
            }
            let notify = s
                .notify
                .iter()
                .map(EventFd::try_clone)
                .collect::<Result<Vec<_>, _>>()
                .map_err(err)?;
            let tap = s.transport.lock().ok().and_then(|t| t.device().host_fd());
            devices.push(Device {
                transport: Arc::clone(&s.transport),
                notify,
                tap,
                polling: false,
                metrics: Arc::clone(&s.metrics),
            });
        }
        let (events, their_events) = channel();
        let (their_replies, replies) = channel();
        let state = Loop {
            devices,
            mem,
            wake: wake.try_clone().map_err(err)?,
            events: their_events,
            replies: their_replies,
            stop: false,
            halt: halt.clone(),
        };
        let join = thread::Builder::new()
            .name(name.into())
            .spawn(move || run(state, mode, kind, name))
            .map_err(err)?;
        Ok(OneThread {
            events,
            replies,
            wake,
            halt,
            join: Some(join),
        })
    }

    fn ask(&self, event: DeviceEvent) -> bool {
        // A pause or a stop cuts a device's drain short after the request
        // at hand; a resume lets the next drain run whole.
        self.halt.set(event != DeviceEvent::Resume);
        self.events.send(event).is_ok() && self.wake.write(1).is_ok()
    }

    fn pause(&self) -> Result<(), ControlError> {
        if self.ask(DeviceEvent::Pause) && self.replies.recv() == Ok(DeviceEvent::Pause) {
            Ok(())
        } else {
            Err(ControlError::Stopped("the device thread paused"))
        }
    }

    fn resume(&self) -> Result<(), ControlError> {
        if self.ask(DeviceEvent::Resume) && self.replies.recv() == Ok(DeviceEvent::Resume) {
            Ok(())
        } else {
            Err(ControlError::Stopped("the device thread resumed"))
        }
    }

    fn finish(mut self) -> Result<(), VirtioError> {
        self.ask(DeviceEvent::Finish);
        match self.join.take().map(JoinHandle::join) {
            Some(Err(_)) => Err(VirtioError::Panicked),
            _ => Ok(()),
        }
    }
}

fn run(state: Loop, mode: SeccompMode, kind: ThreadKind, name: &str) {
    let mut manager = match EventManager::<Arc<Mutex<Loop>>>::new() {
        Ok(m) => m,
        Err(e) => {
            log::error!("virtio devices: cannot create the event loop: {e:?}; the devices stop");
            return;
        }
    };
    let state = Arc::new(Mutex::new(state));
    manager.add_subscriber(Arc::clone(&state));
    if let Err(e) = seccomp::install(kind, mode, name) {
        log::error!("virtio devices: {e}; the devices stop");
        return;
    }
    loop {
        if state.lock().map_or(true, |s| s.stop) {
            return;
        }
        if let Err(e) = manager.run() {
            log::error!("virtio devices: the event loop failed: {e:?}; the devices stop");
            return;
        }
    }
}
