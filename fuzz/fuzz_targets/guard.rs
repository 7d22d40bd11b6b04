//! The guard on arbitrary guest memory and control registers: 64 KiB of RAM
//! (with a hole) filled with the input, so page tables, CR3 and the
//! addresses are all the fuzzer's. Nothing may panic, a successful access
//! must lie in guest RAM (translation alone does not check RAM; `check`
//! does), and the walk must end.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lwpvmm::guard::{Access, GuestMemory, GuestView, Paging, PagingCaps, Vendor};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

const ACCESSES: [Access; 6] = [
    Access::UserRead,
    Access::UserWrite,
    Access::SupervisorRead,
    Access::SupervisorWrite,
    Access::UserFetch,
    Access::SupervisorFetch,
];

fn u64_at(data: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, x) in b.iter_mut().enumerate() {
        *x = data.get(at + i).copied().unwrap_or(0);
    }
    u64::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 48 {
        return;
    }
    let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 0x8000), (GuestAddress(0xC000), 0x4000)])
        .expect("guest memory");
    let _ = mem.write_slice(&data[48..data.len().min(48 + 0x8000)], GuestAddress(0));
    let cr3 = u64_at(data, 0);
    let cr4 = 0x20 | (u64_at(data, 8) & (1 << 20 | 1 << 21 | 1 << 17 | 1 << 22));
    let efer = 0x500 | (u64_at(data, 8) & (1 << 11));
    let cr0 = 0x8000_0001 | (u64_at(data, 8) & (1 << 16));
    let flags = data[16] >> 6 | data[17] << 2;
    let caps = PagingCaps {
        vendor: if flags & 8 != 0 { Vendor::Amd } else { Vendor::Intel },
        maxphyaddr: data[16] % 64,
        page_1g: flags & 1 != 0,
        nx: flags & 2 != 0,
        pku: flags & 4 != 0,
    };
    let pkru = u64_at(data, 40) as u32;
    let Ok(paging) = Paging::from_regs(cr0, cr3, cr4, efer, caps, pkru) else {
        return;
    };
    let view = GuestView::new(&mem, paging);
    for op in data[17..48].chunks(8).take(3) {
        let address = u64_at(op, 0) ^ u64_at(data, 24);
        let access = ACCESSES[usize::from(op[0] % 6)];
        let len = u64::from(op.get(1).copied().unwrap_or(0)) * 37;
        if view.check(address, 1, access).is_ok() {
            let gpa = view.translate(address, access).expect("a checked address translates");
            assert!(GuestMemoryBackend::check_range(&mem, GuestAddress(gpa), 1));
        }
        let _ = view.check(address, len, access);
        let mut buf = vec![0u8; (len % 300) as usize];
        if view.read(address, &mut buf, access).is_ok() {
            let _ = view.write(address, &buf, access);
        }
    }
});
