//! The one queue drain every virtio device's request path uses: it pops the
//! chains the driver made available, hands each to the device, returns it
//! to the used ring, and bounds the work. Notifications are suppressed
//! while it drains (EVENT_IDX) and re-enabled at the end, with a recheck
//! for chains that arrived meanwhile; a driver that announces chains none
//! of which can be read is a ring no loop may spin on (`Stalled`); at most
//! [`CHAINS_PER_CALL`] chains go per call, and fewer when the device thread
//! is asked to pause ([`Halt`]): the rest is taken up after the other
//! events, or after the pause.

use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};

use super::device::DeviceError;
use super::mmio::{CHAINS_PER_CALL, Halt};
use crate::guard::GuestMemory;

/// What a drain did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    /// At least one chain went back to the used ring.
    pub used: bool,
    /// It stopped early (the per-call limit, or a pause): call it again.
    pub again: bool,
}

/// Drains `queue`: `handle` serves one chain and says how many bytes it
/// wrote into the chain's buffers (the used element's length).
pub fn drain(
    queue: &mut Queue,
    mem: &GuestMemory,
    halt: &Halt,
    mut handle: impl FnMut(DescriptorChain<&GuestMemory>) -> u32,
) -> Result<Drained, DeviceError> {
    drain_until(queue, mem, halt, |chain| Some(handle(chain))).map(|(done, _)| done)
}

/// Drains `queue` as [`drain`] does, while `handle` can serve each chain:
/// a chain it cannot serve now (`None`: a rate limiter's tokens ran out)
/// goes back to the ring unserved, and the drain stops with notifications
/// left off; the second value says so. The device takes the ring up again
/// when it can serve (its timer).
pub fn drain_until(
    queue: &mut Queue,
    mem: &GuestMemory,
    halt: &Halt,
    mut handle: impl FnMut(DescriptorChain<&GuestMemory>) -> Option<u32>,
) -> Result<(Drained, bool), DeviceError> {
    let mut done = Drained::default();
    let mut total = 0;
    loop {
        queue.disable_notification(mem)?;
        let mut popped = 0;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            popped += 1;
            total += 1;
            let head = chain.head_index();
            let Some(written) = handle(chain) else {
                queue.go_to_previous_position();
                return Ok((done, true));
            };
            queue.add_used(mem, head, written)?;
            done.used = true;
            if total >= CHAINS_PER_CALL || halt.requested() {
                done.again = true;
                return Ok((done, false));
            }
        }
        if !queue.enable_notification(mem)? {
            return Ok((done, false));
        }
        // More announced, none readable: a ring no loop may spin on.
        if popped == 0 {
            return Err(DeviceError::Stalled);
        }
    }
}

/// The next receive buffer the driver posted, for a device that fills
/// them from the host (the network device, vsock): `None` when there is
/// none, with notifications back on so that the driver's next buffer is
/// heard of, after one recheck for a buffer that arrived meanwhile; a ring
/// that announces buffers none of which can be read is `Stalled`.
pub fn next_buffer<'m>(
    queue: &mut Queue,
    mem: &'m GuestMemory,
) -> Result<Option<DescriptorChain<&'m GuestMemory>>, DeviceError> {
    let mut rechecked = false;
    loop {
        if let Some(chain) = queue.pop_descriptor_chain(mem) {
            return Ok(Some(chain));
        }
        if !queue.enable_notification(mem)? {
            return Ok(None);
        }
        if rechecked {
            return Err(DeviceError::Stalled);
        }
        rechecked = true;
    }
}

/// A chain of one descriptor at `addr`, for the devices' tests on mock
/// queues (`VRING_DESC_F_WRITE` in `flags` for a receive buffer).
#[cfg(test)]
pub fn one_descriptor(addr: u64, len: u32, flags: u32) -> Vec<virtio_queue::desc::RawDescriptor> {
    vec![virtio_queue::desc::RawDescriptor::from(
        virtio_queue::desc::split::Descriptor::new(addr, len, flags as u16, 0),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{RawDescriptor, split::Descriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Address, Bytes, GuestAddress};

    /// Four one-descriptor chains drained with and without a halt, then a
    /// ring that announces chains it does not hold.
    #[test]
    fn a_drain_serves_bounds_and_refuses_a_ring_it_cannot_read() {
        let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let vq = MockSplitQueue::new(&mem, 16);
        let mut queue: Queue = vq.create_queue().unwrap();
        let chains: Vec<RawDescriptor> = (0..4)
            .map(|i| {
                RawDescriptor::from(Descriptor::new(
                    0x1_0000 + i * 0x100,
                    16,
                    VRING_DESC_F_WRITE as u16,
                    0,
                ))
            })
            .collect();
        vq.add_desc_chains(&chains, 0).unwrap();
        let halt = Halt::default();
        // (halted, chains served, what the drain says)
        let table = [
            (
                true,
                1,
                Drained {
                    used: true,
                    again: true,
                },
            ),
            (
                false,
                3,
                Drained {
                    used: true,
                    again: false,
                },
            ),
            (
                false,
                0,
                Drained {
                    used: false,
                    again: false,
                },
            ),
        ];
        for (halted, want, says) in table {
            halt.set(halted);
            let mut served = 0;
            let done = drain(&mut queue, &mem, &halt, |_| {
                served += 1;
                8
            })
            .unwrap();
            assert_eq!((served, done), (want, says), "halted {halted}");
        }
        let used_len: u32 = mem.read_obj(vq.used_addr().unchecked_add(4 + 4)).unwrap();
        assert_eq!(used_len, 8, "the length the device wrote");
        // One more chain announced, whose head is no descriptor of the
        // queue: nothing can be read, and the drain refuses the ring at
        // once (the device then needs a reset) instead of spinning.
        let avail_idx = vq.avail_addr().unchecked_add(2);
        let idx: u16 = mem.read_obj(avail_idx).unwrap();
        let slot = vq.avail_addr().unchecked_add(4 + 2 * u64::from(idx % 16));
        mem.write_obj(99u16, slot).unwrap();
        mem.write_obj(idx.wrapping_add(1), avail_idx).unwrap();
        let got = drain(&mut queue, &mem, &halt, |_| 0);
        assert!(got.is_err(), "{got:?}");
    }
}
