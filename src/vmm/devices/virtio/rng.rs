//! The entropy device (virtio-rng, device ID 4; Firecracker's `/entropy`):
//! one request queue whose device-writable buffers are filled from the
//! host's getrandom, at most [`MAX_REQUEST`] bytes a request, as fast as
//! the device's rate limiter allows. A request the limiter holds back goes
//! back to the ring unserved, and a timer (the host descriptor the device
//! thread polls) takes the ring up again once its tokens are there.

use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vmm_sys_util::timerfd::TimerFd;

use super::device::{DeviceError, DeviceSpec, VirtioError};
use super::drain::drain_until;
use super::mmio::{Halt, Progress, VirtioDevice};
use super::rate_limiter::{RateLimit, RateLimiter};
use crate::guard::GuestMemory;
use crate::vmm::base::metrics::DeviceMetrics;

/// virtio's device ID of an entropy source.
pub const VIRTIO_ID_RNG: u32 = 4;
const QUEUE_SIZE: u16 = 256;
/// The most bytes one request gets: Linux's driver asks for 64 at a time
/// (its hwrng buffer); a larger buffer gets this much, which the driver
/// takes as a short read.
pub const MAX_REQUEST: u64 = 64 << 10;

/// An entropy device to attach (`--entropy`, `PUT /entropy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntropyConfig {
    /// How fast the guest may draw, if limited.
    pub rate_limit: Option<RateLimit>,
}

/// The device.
pub struct Rng {
    config: EntropyConfig,
    limiter: Option<RateLimiter>,
    /// Armed while a request waits for the limiter's tokens.
    timer: TimerFd,
    waiting: bool,
    buf: Vec<u8>,
    metrics: Arc<DeviceMetrics>,
    halt: Halt,
}

impl Rng {
    /// A device for `config`, its limiter's buckets full.
    pub fn new(config: &EntropyConfig, metrics: Arc<DeviceMetrics>) -> Result<Self, VirtioError> {
        Ok(Rng {
            config: *config,
            limiter: config
                .rate_limit
                .map(|l| RateLimiter::new(&l, Instant::now())),
            timer: TimerFd::new().map_err(|e| VirtioError::EventFd(e.into()))?,
            waiting: false,
            buf: Vec::new(),
            metrics,
            halt: Halt::default(),
        })
    }

    /// Fills one request's buffers; `None` when the limiter holds it back
    /// (`wait` then says for how long).
    fn fill(
        &mut self,
        chain: DescriptorChain<&GuestMemory>,
        mem: &GuestMemory,
        now: Instant,
        wait: &mut Option<Duration>,
    ) -> Option<u32> {
        let Ok(mut writer) = chain.writer(mem) else {
            self.metrics.device_errors.fetch_add(1, Ordering::Relaxed);
            return Some(0);
        };
        let cap = self
            .limiter
            .as_ref()
            .map_or(MAX_REQUEST, |l| l.max_bytes().min(MAX_REQUEST));
        let want = (writer.available_bytes() as u64).min(cap);
        if want == 0 {
            return Some(0);
        }
        if let Some(limiter) = &mut self.limiter
            && let Err(w) = limiter.consume(want, now)
        {
            *wait = Some(w);
            return None;
        }
        self.buf.resize(want as usize, 0);
        if getrandom::fill(&mut self.buf).is_err() {
            self.metrics.device_errors.fetch_add(1, Ordering::Relaxed);
            return Some(0);
        }
        match std::io::Write::write_all(&mut writer, &self.buf) {
            Ok(()) => {
                self.metrics
                    .entropy_bytes
                    .fetch_add(want, Ordering::Relaxed);
                Some(want as u32)
            }
            Err(_) => {
                self.metrics.device_errors.fetch_add(1, Ordering::Relaxed);
                Some(0)
            }
        }
    }

    /// Serves the requests the ring holds, as far as the limiter lets it.
    fn serve(&mut self, queues: &mut [Queue], mem: &GuestMemory) -> Result<Progress, DeviceError> {
        let queue = queues.get_mut(0).ok_or(DeviceError::NoQueue(0))?;
        let halt = self.halt.clone();
        let now = Instant::now();
        let mut wait = None;
        let (done, held) = drain_until(queue, mem, &halt, |chain| {
            self.fill(chain, mem, now, &mut wait)
        })?;
        if held {
            self.metrics
                .entropy_rate_limited
                .fetch_add(1, Ordering::Relaxed);
            let wait = wait.unwrap_or(Duration::from_millis(1));
            self.waiting = self.timer.reset(wait, None).is_ok();
        }
        Ok(Progress {
            interrupt: done.used && queue.needs_notification(mem)?,
            host_input: Some(self.waiting),
            again: done.again,
        })
    }
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_RNG
    }

    fn features(&self) -> u64 {
        0
    }

    fn queue_max_sizes(&self) -> &'static [u16] {
        &[QUEUE_SIZE]
    }

    fn read_config(&self, _: u64, data: &mut [u8]) {
        // virtio-rng has no configuration space.
        data.fill(0);
    }

    fn notified(
        &mut self,
        index: usize,
        queues: &mut [Queue],
        mem: &GuestMemory,
    ) -> Result<Progress, DeviceError> {
        if index != 0 {
            return Err(DeviceError::NoQueue(index));
        }
        // A request waiting for tokens is taken up by the timer, in order.
        if self.waiting {
            return Ok(Progress::default());
        }
        self.serve(queues, mem)
    }

    fn host_input(
        &mut self,
        queues: &mut [Queue],
        mem: &GuestMemory,
    ) -> Result<Progress, DeviceError> {
        // The timer fired: its count is read so that it stops being
        // readable.
        let _ = self.timer.wait();
        self.waiting = false;
        self.serve(queues, mem)
    }

    fn set_halt(&mut self, halt: Halt) {
        self.halt = halt;
    }

    fn host_fd(&self) -> Option<RawFd> {
        Some(self.timer.as_raw_fd())
    }

    fn spec(&self) -> DeviceSpec {
        DeviceSpec::Rng {
            rate_limit: self.config.rate_limit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmm::devices::virtio::drain::one_descriptor as one;
    use crate::vmm::devices::virtio::rate_limiter::BucketConfig;
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Address, Bytes, GuestAddress};

    /// Requests of `sizes` bytes (device-writable) on a fresh queue, served
    /// by a device with `limit`: the bytes each got, in ring order, and the
    /// device's counters.
    fn serve(sizes: &[u32], limit: Option<RateLimit>) -> (Vec<u32>, bool, u64, Vec<u8>) {
        let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), 16);
        let mut queues = vec![vq.create_queue().unwrap()];
        for (i, &len) in sizes.iter().enumerate() {
            let chain = one(0x10_0000 + i as u64 * 0x1_0000, len, VRING_DESC_F_WRITE);
            vq.add_desc_chains(&chain, i as u16).unwrap();
        }
        let metrics = Arc::new(DeviceMetrics::default());
        let mut rng = Rng::new(&EntropyConfig { rate_limit: limit }, Arc::clone(&metrics)).unwrap();
        let progress = rng.notified(0, &mut queues, &mem).unwrap();
        let used = vq.used_addr();
        let served: u16 = mem.read_obj(used.unchecked_add(2)).unwrap();
        let lens: Vec<u32> = (0..u64::from(served))
            .map(|i| mem.read_obj(used.unchecked_add(4 + 8 * i + 4)).unwrap())
            .collect();
        let mut first = vec![0u8; 32];
        mem.read_slice(&mut first, GuestAddress(0x10_0000)).unwrap();
        assert_eq!(progress.host_input, Some(rng.waiting));
        (
            lens,
            rng.waiting,
            metrics.entropy_bytes.load(Ordering::Relaxed),
            first,
        )
    }

    #[test]
    fn requests_get_random_bytes_as_fast_as_the_limiter_allows() {
        let bytes = |size| {
            Some(RateLimit {
                bandwidth: Some(BucketConfig {
                    size,
                    one_time_burst: 0,
                    refill_time: 1000,
                }),
                ops: None,
            })
        };
        // (what, request sizes, limit, bytes each served, waiting after)
        type Case = (
            &'static str,
            &'static [u32],
            Option<RateLimit>,
            &'static [u32],
            bool,
        );
        let table: [Case; 4] = [
            ("unlimited", &[64, 64, 16], None, &[64, 64, 16], false),
            (
                "a buffer larger than a request gets MAX_REQUEST",
                &[1 << 20],
                None,
                &[MAX_REQUEST as u32],
                false,
            ),
            (
                "100 bytes a second: the third request waits, in the ring",
                &[64, 32, 64],
                bytes(100),
                &[64, 32],
                true,
            ),
            (
                "a request larger than the bucket gets the bucket's size",
                &[64],
                bytes(40),
                &[40],
                false,
            ),
        ];
        for (what, sizes, limit, want, waiting) in table {
            let (lens, held, total, first) = serve(sizes, limit);
            assert_eq!(lens, want, "{what}");
            assert_eq!(held, waiting, "{what}");
            assert_eq!(
                total,
                want.iter().map(|&n| u64::from(n)).sum::<u64>(),
                "{what}"
            );
            assert_ne!(first, [0u8; 32], "{what}: the buffer holds random bytes");
        }
    }
}
