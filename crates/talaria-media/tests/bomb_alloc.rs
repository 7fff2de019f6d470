//! A decompression bomb is refused before any large allocation.
//!
//! Timing says "quickly"; only the allocator can say "without allocating
//! the pixels". This test binary counts the largest single allocation
//! made while the bomb is handled. It is a binary of its own so that its
//! allocator sees nothing but this test.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use talaria_media::{MediaError, prepare_image};

/// The system allocator, remembering the largest request it served.
struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`; the only addition
// is an atomic maximum, which allocates nothing.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

// One test only: the counter is global, and a second test running beside
// it on another thread would count its own allocations.
#[test]
fn a_50000_by_50000_png_is_refused_without_a_large_allocation() {
    // First, that the counter sees a large allocation when there is one:
    // without this, a counter that never counted would pass.
    LARGEST.store(0, Ordering::Relaxed);
    let big = vec![1u8; 8 * 1024 * 1024];
    assert!(LARGEST.load(Ordering::Relaxed) >= big.len());
    drop(big);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bomb.png");
    std::fs::write(&path, common::png_header(50_000, 50_000)).unwrap();

    LARGEST.store(0, Ordering::Relaxed);
    let err = prepare_image(&path, 1568).unwrap_err();
    let largest = LARGEST.load(Ordering::Relaxed);

    assert!(matches!(err, MediaError::ImageTooLarge { .. }), "{err:?}");
    // The pixels would be 10 GB; a read buffer or two is all it may take.
    assert!(largest < 1024 * 1024, "largest allocation: {largest} bytes");
}
