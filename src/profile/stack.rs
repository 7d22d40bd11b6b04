//! Call stacks of an interrupted context, unwound by frame pointers through
//! [`StackMemory`]: for a process, each read is a CPL3 load through the
//! guest's page tables ([`UserMemory`]), as the guard checks every access
//! lwpvmm makes for a guest; for the guest kernel (a whole-guest sample), a
//! supervisor load through the same walk.
//!
//! The stack is context for the host-side trace only; nothing is written to
//! guest memory. Its contents are the guest's, so the walk is bounded in
//! frames and in how far one frame may lie above the last, and it stops at
//! the first frame that faults, goes down the stack, or is misaligned,
//! keeping what it found so far.

use crate::lwp::memory::UserMemory;

/// The most return addresses one stack holds.
pub const MAX_FRAMES: usize = 64;

/// The furthest one frame may lie above the one below it (and the first
/// above the stack pointer): a larger step is a clobbered frame pointer,
/// not a frame.
pub const MAX_FRAME_SPAN: u64 = 1 << 20;

/// Where an unwind starts: the interrupted context's frame pointer (RBP or
/// EBP) and stack pointer, and whether its code is 64-bit (8-byte slots;
/// 32-bit code has 4-byte slots and 32-bit addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnwindStart {
    /// RBP (EBP in 32-bit code).
    pub fp: u64,
    /// RSP (ESP).
    pub sp: u64,
    /// 64-bit code.
    pub long_mode: bool,
}

/// What an unwind found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unwound {
    /// The return addresses of the frames above the start, innermost first:
    /// the caller of the interrupted function, its caller, and so on.
    /// Empty when the frame pointer does not point into the stack.
    pub frames: Vec<u64>,
    /// The word at the stack pointer: the return address when the
    /// interrupted function has not set up a frame (a leaf function, or its
    /// first instruction), which a report that knows the function's code
    /// puts in front of `frames`.
    pub top: Option<u64>,
    /// The frame pointer the walk stopped at. Linux's entry code leaves the
    /// address of the interrupted context's saved registers there, with
    /// bit 0 set (`ENCODE_FRAME_POINTER`).
    pub last_fp: u64,
    /// The address of the last frame read (0 when none was): the frame of
    /// the return address last in `frames`.
    pub last_frame: u64,
}

/// Where a stack is read from.
pub trait StackMemory {
    /// Reads `buf.len()` bytes at `address`; false when that faults.
    fn read_stack(&mut self, address: u64, buf: &mut [u8]) -> bool;
}

impl<T: UserMemory + ?Sized> StackMemory for T {
    fn read_stack(&mut self, address: u64, buf: &mut [u8]) -> bool {
        self.read_user(address, buf).is_ok()
    }
}

/// Unwinds the stack from `start`.
pub fn unwind(mem: &mut dyn StackMemory, start: UnwindStart) -> Unwound {
    let (slot, mask) = if start.long_mode {
        (8u64, u64::MAX)
    } else {
        (4, u64::from(u32::MAX))
    };
    let (mut fp, sp) = (start.fp & mask, start.sp & mask);
    let mut top = [0u8; 8];
    let top = mem
        .read_stack(sp, &mut top[..slot as usize])
        .then(|| u64::from_le_bytes(top));
    let mut below = sp;
    let mut stack = Vec::new();
    while stack.len() < MAX_FRAMES {
        // The first frame may sit at the stack pointer; each later one must
        // lie above the last, so that a cycle ends the walk.
        let up = if stack.is_empty() {
            fp >= below
        } else {
            fp > below
        };
        if fp == 0 || fp % slot != 0 || !up || fp - below > MAX_FRAME_SPAN {
            break;
        }
        let mut pair = [0u8; 16];
        let pair = &mut pair[..2 * slot as usize];
        if !mem.read_stack(fp, pair) {
            break;
        }
        let word = |b: &[u8]| {
            let mut w = [0u8; 8];
            w[..b.len()].copy_from_slice(b);
            u64::from_le_bytes(w)
        };
        let (saved_fp, ret) = pair.split_at(slot as usize);
        let (saved_fp, ret) = (word(saved_fp), word(ret));
        if ret == 0 {
            break;
        }
        stack.push(ret);
        below = fp;
        fp = saved_fp;
    }
    Unwound {
        last_frame: if stack.is_empty() { 0 } else { below },
        frames: stack,
        top,
        last_fp: fp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lwp::fault::GuestFault;

    /// A stack of 64-bit or 32-bit words at `base`; reads outside it fault.
    struct Stack {
        base: u64,
        bytes: Vec<u8>,
    }

    impl Stack {
        fn new(base: u64, words: &[u64], slot: usize) -> Self {
            let bytes = words
                .iter()
                .flat_map(|w| w.to_le_bytes()[..slot].to_vec())
                .collect();
            Stack { base, bytes }
        }
    }

    impl UserMemory for Stack {
        fn read_user(&mut self, address: u64, buf: &mut [u8]) -> Result<(), GuestFault> {
            let fault = GuestFault::PageFault {
                address,
                error_code: 4,
            };
            let at = address.checked_sub(self.base).ok_or(fault)? as usize;
            let src = self.bytes.get(at..at + buf.len()).ok_or(fault)?;
            buf.copy_from_slice(src);
            Ok(())
        }

        fn write_user(&mut self, address: u64, _: &[u8]) -> Result<(), GuestFault> {
            Err(GuestFault::PageFault {
                address,
                error_code: 6,
            })
        }

        fn check_user_write(&mut self, address: u64, _: u64) -> Result<(), GuestFault> {
            self.write_user(address, &[])
        }

        fn check_user_read(&mut self, _: u64, _: u64) -> Result<(), GuestFault> {
            Ok(())
        }
    }

    const BASE: u64 = 0x7000;

    fn at(word: u64) -> u64 {
        BASE + 8 * word
    }

    #[test]
    fn frames_are_followed_and_every_bad_one_ends_the_walk() {
        // Frames at words 2, 6 and 10: (saved frame pointer, return address).
        let good = [
            0,
            0,
            at(6),
            0x401111,
            0,
            0,
            at(10),
            0x402222,
            0,
            0,
            0,
            0x403333,
        ];
        let start = UnwindStart {
            fp: at(2),
            sp: at(0),
            long_mode: true,
        };
        let mut looping = good;
        looping[6] = at(2);
        let mut zero_ret = good;
        zero_ret[7] = 0;
        let mut misaligned = good;
        misaligned[6] = at(10) + 3;
        let mut far = good;
        far[6] = at(6) + MAX_FRAME_SPAN + 8;
        // (what, stack, start, return addresses found)
        let table: [(&str, [u64; 12], UnwindStart, &[u64]); 7] = [
            (
                "three frames, the last one's saved RBP 0",
                good,
                start,
                &[0x401111, 0x402222, 0x403333],
            ),
            (
                "a frame pointing down the stack",
                looping,
                start,
                &[0x401111, 0x402222],
            ),
            ("a zero return address", zero_ret, start, &[0x401111]),
            (
                "a misaligned frame pointer",
                misaligned,
                start,
                &[0x401111, 0x402222],
            ),
            (
                "a frame too far above the last",
                far,
                start,
                &[0x401111, 0x402222],
            ),
            (
                "RBP below RSP",
                good,
                UnwindStart { sp: at(3), ..start },
                &[],
            ),
            (
                "RBP outside mapped memory",
                good,
                UnwindStart {
                    fp: 0x10_0000,
                    sp: 0x0f_f000,
                    ..start
                },
                &[],
            ),
        ];
        for (what, words, start, want) in table {
            let mut mem = Stack::new(BASE, &words, 8);
            assert_eq!(unwind(&mut mem, start).frames, want, "{what}");
        }
    }

    #[test]
    fn a_cycle_is_bounded_and_32_bit_code_has_4_byte_slots() {
        // A frame whose saved RBP is itself: the walk stops, it never spins.
        let mut mem = Stack::new(BASE, &[at(0), 0x401000], 8);
        let start = UnwindStart {
            fp: at(0),
            sp: at(0),
            long_mode: true,
        };
        let found = unwind(&mut mem, start);
        assert_eq!((found.frames, found.top), (vec![0x401000], Some(at(0))));
        // 32-bit: frames at byte 8 and 16, 4-byte words; the high half of
        // RBP is ignored.
        let words = [
            0,
            0,
            BASE + 16,
            0x0804_8111,
            BASE + 24,
            0x0804_8222,
            0,
            0x0804_8333,
        ];
        let mut mem = Stack::new(BASE, &words, 4);
        let start = UnwindStart {
            fp: (0xdead << 32) | (BASE + 8),
            sp: BASE,
            long_mode: false,
        };
        let found = unwind(&mut mem, start);
        assert_eq!(found.frames, [0x0804_8111, 0x0804_8222, 0x0804_8333]);
        assert_eq!(found.top, Some(0), "the 32-bit word at ESP");
    }

    #[test]
    fn the_walk_is_bounded_in_frames() {
        // Every frame points 16 bytes up: far more frames than the limit.
        let words: Vec<u64> = (0..2 * MAX_FRAMES as u64 + 8)
            .flat_map(|i| [BASE + 16 * (i + 1), 0x40_0000 + i])
            .collect();
        let mut mem = Stack::new(BASE, &words, 8);
        let start = UnwindStart {
            fp: BASE,
            sp: BASE,
            long_mode: true,
        };
        assert_eq!(unwind(&mut mem, start).frames.len(), MAX_FRAMES);
    }
}
