//! Segment descriptors decoded as a processor loads them: what a selector
//! and its 8-byte descriptor put in a segment register. Boot builds its GDT
//! with it; privilege.rs reads the guest's descriptors with it.

use kvm_bindings::kvm_segment;

/// The segment register `selector` loads from the 8-byte descriptor `d`.
pub fn segment(selector: u16, d: u64) -> kvm_segment {
    let bit = |n: u32| ((d >> n) & 1) as u8;
    let limit = ((d & 0xffff) | ((d >> 32) & 0xf_0000)) as u32;
    let g = bit(55);
    kvm_segment {
        base: ((d >> 16) & 0xff_ffff) | ((d >> 32) & 0xff00_0000),
        limit: if g == 1 { (limit << 12) | 0xfff } else { limit },
        selector,
        type_: ((d >> 40) & 0xf) as u8,
        present: bit(47),
        dpl: ((d >> 45) & 3) as u8,
        db: bit(54),
        s: bit(44),
        l: bit(53),
        g,
        avl: bit(52),
        unusable: u8::from(bit(47) == 0),
        padding: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_decode_to_segments() {
        // (descriptor, base, limit, type, DPL, L, present)
        let table = [
            (0x00af_9b00_0000_ffff_u64, 0, 0xffff_ffff, 0xb, 0, 1, 1),
            (0x00cf_f300_0000_ffff, 0, 0xffff_ffff, 0x3, 3, 0, 1),
            (0x0040_8912_3456_0067, 0x0012_3456, 0x67, 0x9, 0, 0, 1),
            (0x00af_1b00_0000_ffff, 0, 0xffff_ffff, 0xb, 0, 1, 0),
        ];
        for (d, base, limit, type_, dpl, l, present) in table {
            let s = segment(0x08, d);
            assert_eq!(
                (s.base, s.limit, s.type_, s.dpl, s.l, s.present, s.unusable),
                (base, limit, type_, dpl, l, present, 1 - present),
                "{d:#x}"
            );
        }
    }
}
