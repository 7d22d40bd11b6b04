//! `cargo bench --bench vmm -- kernel_profile`: whole-guest samples
//! (`--profile-kernel`) against the same loop without them and against the
//! floor of any exit. Shared helpers are the bench root's (vmm.rs).

use super::*;

/// Whole-guest samples (`--profile-kernel`, issue 32) against the same
/// loop without them and against the floor of any exit, in one run: every
/// vCPU kicked, LWP armed or not (the loop runs without LWP), each kick a
/// sample with its stack, kept nowhere (no trace, no capture: the kick and
/// the look are the cost).
pub fn kernel_profile() {
    let bare_exit = round_trip_cycles()[1];
    // Whole-guest samples: every vCPU kicked, LWP armed or not (the loop
    // runs without LWP), each kick a sample with its stack, kept nowhere
    // (no trace, no capture: the kick and the look are the cost).
    let bare_loop = (0..3)
        .map(|_| throughput(0, None, None))
        .min_by(|a, b| a.cycles.total_cmp(&b.cycles))
        .expect("three runs");
    for rate in [1000, 10_000] {
        let on = (0..3)
            .map(|_| throughput_of(rate, None, None, true))
            .min_by(|a, b| a.cycles.total_cmp(&b.cycles))
            .expect("three runs");
        let per_kick = (on.cycles - bare_loop.cycles) / on.kicks.max(1) as f64;
        println!(
            "  whole-guest samples at {} kHz: {} kicks, {per_kick:.0} cycles of CPL3 throughput per kick",
            rate / 1000,
            on.kicks
        );
        println!(
            "kernel sampling on / off, CPL3 loop = {:.3}  ({} kHz)",
            bare_loop.cycles / on.cycles,
            rate / 1000
        );
        println!(
            "whole-guest kick / bare kick exit = {:.2}  ({} kHz)",
            per_kick / bare_exit,
            rate / 1000
        );
    }
}
