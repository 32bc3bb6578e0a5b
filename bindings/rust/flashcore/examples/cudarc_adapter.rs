//! flashcore on device memory and a stream from cudarc: the adapter pattern,
//! for cudarc or any crate whose buffer types are not yours.
//!
//! No `impl DeviceBuffer for cudarc::driver::CudaSlice<T>` can be written in
//! your crate (Rust's orphan rule: neither the trait nor the type is yours),
//! and flashcore does not depend on cudarc (its builds are offline, and
//! cudarc is neither vendored nor packaged by Debian). A stream-less
//! `device_ptr()` would be wrong for cudarc anyway: since 0.17 it hands out
//! an address only for work on a given stream, with a `SyncOnDrop` guard
//! that records that work (for other streams to wait on) when dropped, so
//! the guard must outlive the launch. The adapter is therefore a type of your
//! own, made for one call: [`OnStream`] holds the address, the length and the
//! guard, and implements [`DeviceBuffer`]. The params borrow it, so it cannot
//! be dropped before `forward` has queued the kernel. The stream argument is
//! `stream.cu_stream().cast()`: a `CUstream` is a `cudaStream_t`.
//!
//! The `cudarc` module at the end stands in for the crate, so that this
//! example builds offline, as the project's CI does: it has cudarc 0.18's
//! names and signatures for what the example uses, on the CUDA driver API
//! that the GPU test opens at run time (tests/gpu/cuda.rs). With the real
//! crate (`cudarc = { version = "0.18", features = ["cuda-13000"] }`, the
//! feature naming your CUDA version), delete that module and the `cuda` one:
//! the rest compiles as it is.
//!
//! `cargo run --example cudarc_adapter` computes attention where the answer
//! is known exactly and checks it; without a GPU it says why and exits 0.

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use flashcore::{DeviceBuffer, ForwardParams, Handle, Status};
use std::error::Error;
use std::sync::Arc;

/// A cudarc buffer as flashcore sees it during work queued on one stream:
/// its address and length, and cudarc's guard, which records that work when
/// dropped. Make one per buffer for a call, and drop it after `forward`.
struct OnStream<'a> {
    address: u64,
    bytes: usize,
    _record_after_launch: SyncOnDrop<'a>,
}

impl<'a> OnStream<'a> {
    /// An input (q, k, v, seqused_k, ...): `stream` waits for earlier writes to it.
    fn read<T>(slice: &'a impl DevicePtr<T>, stream: &'a CudaStream) -> Self {
        let bytes = slice.num_bytes();
        let (address, guard) = slice.device_ptr(stream);
        OnStream { address, bytes, _record_after_launch: guard }
    }

    /// An output (out, lse, the workspace): `stream` waits for earlier reads
    /// and writes of it.
    fn write<T>(slice: &'a mut impl DevicePtrMut<T>, stream: &'a CudaStream) -> Self {
        let bytes = slice.num_bytes();
        let (address, guard) = slice.device_ptr_mut(stream);
        OnStream { address, bytes, _record_after_launch: guard }
    }
}

impl DeviceBuffer for OnStream<'_> {
    fn device_ptr(&self) -> u64 {
        self.address
    }

    fn byte_len(&self) -> usize {
        self.bytes
    }
}

const HEADS: usize = 4;
const SEQLEN: usize = 128;
const HEAD_DIM: usize = 64;
/// f16 bit patterns (the example keeps f16 tensors as `u16`, so that it
/// needs no f16 type).
const F16_ONE: u16 = 0x3C00;
const F16_TWO: u16 = 0x4000;
const F16_THREE: u16 = 0x4200;

/// Attention, not causal, over `[1, HEADS, SEQLEN, HEAD_DIM]` f16 tensors,
/// queued on `stream`; returns without waiting for it.
fn attention(
    handle: &Handle,
    stream: &Arc<CudaStream>,
    q: &CudaSlice<u16>,
    k: &CudaSlice<u16>,
    v: &CudaSlice<u16>,
    out: &mut CudaSlice<u16>,
) -> Result<(), Box<dyn Error>> {
    let (q, k, v) = (OnStream::read(q, stream), OnStream::read(k, stream), OnStream::read(v, stream));
    let mut out = OnStream::write(out, stream);
    let params = ForwardParams::builder()
        .batch_size(1)
        .num_heads_q(HEADS as i32)
        .num_heads_kv(HEADS as i32)
        .seqlen_q(SEQLEN as i32)
        .seqlen_k(SEQLEN as i32)
        .head_dim(HEAD_DIM as i32)
        .q(&q)
        .k(&k)
        .v(&v)
        .out(&mut out)
        .build()?;
    // cudarc frees the workspace in stream order once it goes out of scope.
    let mut workspace = match handle.workspace_size(&params)? {
        0 => None,
        bytes => Some(stream.alloc_zeros::<u8>(bytes)?),
    };
    let mut workspace = workspace.as_mut().map(|memory| OnStream::write(memory, stream));
    // SAFETY: every buffer is a live cudarc allocation of the context
    // flashcore's handle uses (the device's primary context), at least as
    // large as its OnStream says; cudarc keeps them until the work queued on
    // `stream` has used them (the guards record it, and frees are stream
    // ordered), and nothing else writes them meanwhile.
    unsafe {
        handle.forward(&params, workspace.as_mut().map(|w| w as &mut dyn DeviceBuffer), stream.cu_stream().cast())?
    };
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    // flashcore first: it says why there is no GPU, where loading the driver
    // would end the program.
    let handle = match Handle::new() {
        Ok(handle) => handle,
        Err(err) if err.status() == Status::NoDevice => {
            println!("nothing to run: {err}");
            return Ok(());
        }
        Err(err) => return Err(err.into()),
    };
    // cudarc's context for a device is its primary context, the one the CUDA
    // runtime inside flashcore uses, so addresses and streams are shared as
    // they are.
    let context = CudaContext::new(handle.device()? as usize)?;
    let stream = context.new_stream()?;

    // q = k = 0: all scores tie, so each query's output is the mean of the
    // values. v's rows alternate 1.0 and 3.0, so that mean is 2.0, exact in
    // f16, in every element.
    let elements = HEADS * SEQLEN * HEAD_DIM;
    let (q, k) = (stream.alloc_zeros::<u16>(elements)?, stream.alloc_zeros::<u16>(elements)?);
    let rows: Vec<u16> = (0..elements).map(|i| if i / HEAD_DIM % 2 == 0 { F16_ONE } else { F16_THREE }).collect();
    let v = stream.clone_htod(&rows)?;
    let mut out = stream.alloc_zeros::<u16>(elements)?;
    attention(&handle, &stream, &q, &k, &v, &mut out)?;
    let out = stream.clone_dtoh(&out)?;

    let wrong = out.iter().filter(|&&x| x != F16_TWO).count();
    if wrong > 0 {
        return Err(format!("{wrong} of {elements} elements of out are not 2.0").into());
    }
    println!("flashcore on cudarc-style buffers: all {elements} elements of out are the mean of v, 2.0");
    Ok(())
}

/// The CUDA driver API, opened at run time; shared with the GPU test, which
/// uses the parts this example does not.
#[allow(dead_code)]
#[path = "../tests/gpu/cuda.rs"]
mod cuda;

/// Stands in for the cudarc crate (see the top of this file): cudarc 0.18's
/// names and signatures for what this example uses. Unlike cudarc it
/// allocates and copies synchronously and tracks no events, so its guards
/// have nothing to record, as cudarc's have not on a context that does not
/// track events.
mod cudarc {
    pub mod driver {
        use crate::cuda;
        use flashcore::DeviceBuffer;
        use std::fmt;
        use std::marker::PhantomData;
        use std::sync::Arc;

        pub mod sys {
            pub type CUdeviceptr = u64;
            pub type CUstream = *mut std::ffi::c_void;
        }

        #[derive(Debug)]
        pub struct DriverError(String);

        impl fmt::Display for DriverError {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::error::Error for DriverError {}

        pub struct CudaContext {
            gpu: &'static cuda::Gpu,
        }

        impl CudaContext {
            pub fn new(ordinal: usize) -> Result<Arc<Self>, DriverError> {
                if ordinal != 0 {
                    return Err(DriverError(format!("device {ordinal}: the driver layer opens device 0 only")));
                }
                Ok(Arc::new(CudaContext { gpu: cuda::gpu().map_err(DriverError)? }))
            }

            pub fn new_stream(self: &Arc<Self>) -> Result<Arc<CudaStream>, DriverError> {
                Ok(Arc::new(CudaStream { gpu: self.gpu, stream: self.gpu.stream() }))
            }
        }

        pub struct CudaStream {
            gpu: &'static cuda::Gpu,
            stream: cuda::Stream<'static>,
        }

        impl CudaStream {
            pub fn cu_stream(&self) -> sys::CUstream {
                self.stream.raw
            }

            pub fn alloc_zeros<T: Copy + Default>(self: &Arc<Self>, len: usize) -> Result<CudaSlice<T>, DriverError> {
                self.clone_htod(&vec![T::default(); len])
            }

            pub fn clone_htod<T: Copy>(self: &Arc<Self>, src: &[T]) -> Result<CudaSlice<T>, DriverError> {
                Ok(CudaSlice { memory: self.gpu.upload(src), len: src.len(), element: PhantomData })
            }

            /// Waits for the work queued before it (the stream is a blocking
            /// one, so the legacy default stream's copy waits for it).
            pub fn clone_dtoh<T: Copy + Default>(self: &Arc<Self>, src: &CudaSlice<T>) -> Result<Vec<T>, DriverError> {
                Ok(self.gpu.download(&src.memory))
            }
        }

        pub struct CudaSlice<T> {
            memory: cuda::DeviceMemory<'static>,
            len: usize,
            element: PhantomData<T>,
        }

        pub struct SyncOnDrop<'a>(PhantomData<&'a CudaStream>);

        pub trait DeviceSlice<T> {
            fn len(&self) -> usize;

            fn num_bytes(&self) -> usize {
                self.len() * std::mem::size_of::<T>()
            }
        }

        pub trait DevicePtr<T>: DeviceSlice<T> {
            fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>);
        }

        pub trait DevicePtrMut<T>: DeviceSlice<T> {
            fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>);
        }

        impl<T> DeviceSlice<T> for CudaSlice<T> {
            fn len(&self) -> usize {
                self.len
            }
        }

        impl<T> DevicePtr<T> for CudaSlice<T> {
            fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
                (self.memory.device_ptr(), SyncOnDrop(PhantomData))
            }
        }

        impl<T> DevicePtrMut<T> for CudaSlice<T> {
            fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
                (self.memory.device_ptr(), SyncOnDrop(PhantomData))
            }
        }
    }
}
