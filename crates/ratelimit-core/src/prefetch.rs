//! A hint to the CPU to start loading a cache line: the one `unsafe` call of this crate.
//!
//! The memory store requests a key's bucket before it reads the clock and takes the shard's lock,
//! so that on a table larger than the cache the bucket's miss overlaps that work instead of
//! following it (on a million keys, checks took 112–123 ns against 166–204 without it; see
//! `docs/benchmarks.md`). A plain load in its place does not help: the lock's atomic instruction
//! waits for it.
//!
//! Stable Rust has no safe prefetch: `std::hint::prefetch_read` is unstable, and the x86-64
//! intrinsic needs `unsafe` (in older Rust an `unsafe fn`, as intrinsics taking a pointer were; in
//! Rust 1.95 a safe function with the `sse` target feature, which a function without that feature
//! may only call in `unsafe` code).

#![allow(unsafe_code)]

/// Asks for the cache line holding `p` to be loaded. `p` may be dangling or out of bounds: it is
/// never dereferenced, and a prefetch never faults. A no-op where there is no prefetch intrinsic
/// to call.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
    // SAFETY: `_mm_prefetch` puts no requirement on `p`: it becomes LLVM's `prefetch`, which
    // changes nothing the program can observe, never reads `p` into it and never faults,
    // whatever `p` points to. What newer Rust versions check instead, that SSE is available, the
    // `cfg` above guarantees (SSE is part of the x86-64 baseline).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse")))]
    let _ = p;
}
