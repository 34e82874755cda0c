//! Typed kernel arguments: [`KernelArgs`] collects a launch's parameters as borrows of typed
//! values, so no caller builds the driver's `void *[]` by hand.

use std::ffi::c_void;
use std::marker::PhantomData;

/// A value that can be passed to a kernel parameter by value: its bytes, as Rust lays them
/// out, are exactly what the kernel's parameter of the matching C type holds.
///
/// Implemented for the fixed-width integers and floats. A device pointer is a `u64` (CUDA's
/// `CUdeviceptr`), passed to a `T *` parameter. There is no `usize`: a kernel's parameters
/// have fixed widths, and the argument's type should say which.
///
/// # Safety
/// An implementor must be plain old data (`Copy`, no references or other Rust pointers, every
/// bit pattern it can hold meaningful to the kernel) whose size, alignment and layout are
/// those of the C type of every kernel parameter it is passed to; a struct must be
/// `#[repr(C)]` with the kernel's field order and padding.
pub unsafe trait KernelArg: Copy + 'static {}

macro_rules! kernel_arg {
    ($($t:ty),*) => {
        $(
            // SAFETY: a fixed-width scalar, laid out as the C type of the same width.
            unsafe impl KernelArg for $t {}
        )*
    };
}

kernel_arg!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

/// The most parameters one launch can take through [`KernelArgs`]; every kernel in the
/// workspace takes far fewer.
pub const MAX_KERNEL_ARGS: usize = 32;

/// A kernel launch's parameters, in the kernel's order, each borrowed for `'a`: the values
/// cannot be moved or dropped while the arguments (and so the launch that reads them) live.
/// Built with [`arg`](Self::arg) and passed to [`Function::launch`](crate::Function::launch).
/// Kept inline (no allocation), since a host-centric launch happens once per request.
///
/// ```
/// use gdr_cuda::KernelArgs;
/// let (dst, n) = (0x7f00_0000_0000u64, 4096u32);
/// let args = KernelArgs::new().arg(&dst).arg(&n);
/// assert_eq!(args.len(), 2);
/// ```
#[derive(Clone, Copy)]
pub struct KernelArgs<'a> {
    ptrs: [*mut c_void; MAX_KERNEL_ARGS],
    len: usize,
    _borrows: PhantomData<&'a ()>,
}

impl<'a> KernelArgs<'a> {
    /// No arguments (a kernel without parameters).
    pub fn new() -> Self {
        KernelArgs {
            ptrs: [std::ptr::null_mut(); MAX_KERNEL_ARGS],
            len: 0,
            _borrows: PhantomData,
        }
    }

    /// Appends `value` as the next parameter.
    ///
    /// # Panics
    /// Past [`MAX_KERNEL_ARGS`] parameters.
    pub fn arg<T: KernelArg>(mut self, value: &'a T) -> Self {
        assert!(
            self.len < MAX_KERNEL_ARGS,
            "a kernel launch takes at most {MAX_KERNEL_ARGS} parameters here"
        );
        // The driver only reads through these pointers (it copies each parameter's bytes at
        // the launch); `*mut` is merely what cuLaunchKernel's signature spells.
        self.ptrs[self.len] = (value as *const T).cast_mut().cast();
        self.len += 1;
        self
    }

    /// How many parameters there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The parameters' addresses, in order: what `cuLaunchKernel` takes as `kernelParams`.
    pub fn as_ptrs(&self) -> &[*mut c_void] {
        &self.ptrs[..self.len]
    }
}

impl Default for KernelArgs<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for KernelArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_ptrs()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pointer_points_at_its_borrowed_value_in_order() {
        let (a, b, c, d) = (0x1122_3344_5566_7788u64, 7u32, -3i32, 2.5f32);
        let (e, f) = (0xabu8, -1.0e300f64);
        let args = KernelArgs::new()
            .arg(&a)
            .arg(&b)
            .arg(&c)
            .arg(&d)
            .arg(&e)
            .arg(&f);
        assert_eq!(args.len(), 6);
        assert!(!args.is_empty());
        let p = args.as_ptrs();
        assert_eq!(p.len(), 6);
        assert_eq!(p[0] as usize, &a as *const u64 as usize);
        assert_eq!(p[1] as usize, &b as *const u32 as usize);
        assert_eq!(p[2] as usize, &c as *const i32 as usize);
        assert_eq!(p[3] as usize, &d as *const f32 as usize);
        assert_eq!(p[4] as usize, &e as *const u8 as usize);
        assert_eq!(p[5] as usize, &f as *const f64 as usize);
        // What the driver reads: each parameter's bytes at its address.
        // SAFETY: each pointer is a live borrow of a value of the type read.
        unsafe {
            assert_eq!(*p[0].cast::<u64>(), a);
            assert_eq!(*p[1].cast::<u32>(), b);
            assert_eq!(*p[2].cast::<i32>(), c);
            assert_eq!(*p[3].cast::<f32>(), d);
            assert_eq!(*p[4].cast::<u8>(), e);
            assert_eq!(*p[5].cast::<f64>(), f);
        }
    }

    #[test]
    fn the_same_value_may_be_passed_twice_and_no_arguments_is_empty() {
        let x = 42u64;
        let args = KernelArgs::new().arg(&x).arg(&x);
        assert_eq!(args.as_ptrs()[0], args.as_ptrs()[1]);
        let none = KernelArgs::default();
        assert!(none.is_empty());
        assert_eq!(none.as_ptrs(), &[] as &[*mut c_void]);
    }

    #[test]
    fn a_struct_vouched_for_is_passed_whole() {
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Pair {
            ptr: u64,
            n: u32,
        }
        // SAFETY: repr(C), plain data, as a kernel's `struct { T *ptr; unsigned n; }`.
        unsafe impl KernelArg for Pair {}
        let p = Pair { ptr: 0x1000, n: 3 };
        let args = KernelArgs::new().arg(&p);
        assert_eq!(args.as_ptrs()[0] as usize, &p as *const Pair as usize);
        // SAFETY: a live borrow of a Pair.
        let back = unsafe { *args.as_ptrs()[0].cast::<Pair>() };
        assert_eq!((back.ptr, back.n), (0x1000, 3));
    }

    #[test]
    fn all_the_room_can_be_used() {
        let vals: Vec<u32> = (0..MAX_KERNEL_ARGS as u32).collect();
        let args = vals.iter().fold(KernelArgs::new(), |a, v| a.arg(v));
        assert_eq!(args.len(), MAX_KERNEL_ARGS);
        for (p, v) in args.as_ptrs().iter().zip(&vals) {
            assert_eq!(*p as usize, v as *const u32 as usize);
        }
    }

    #[test]
    #[should_panic(expected = "at most 32 parameters")]
    fn one_more_than_the_room_panics() {
        let vals = [0u8; MAX_KERNEL_ARGS + 1];
        let _ = vals.iter().fold(KernelArgs::new(), |a, v| a.arg(v));
    }
}
