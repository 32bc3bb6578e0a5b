//! The few CUDA driver API calls the GPU test (and, through its cudarc
//! stand-in, examples/cudarc_adapter.rs) needs. libcuda.so.1 is opened with
//! dlopen at run time, so the binaries start (and skip) on machines without
//! the NVIDIA driver, such as CI.

use std::ffi::{c_void, CStr};
use std::os::raw::{c_char, c_int, c_uint};
use std::sync::Mutex;

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
/// A `CUstream`, which is also a valid `cudaStream_t`.
pub type CuStream = *mut c_void;

const RTLD_NOW: c_int = 2;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` and `_MINOR`.
const COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const COMPUTE_CAPABILITY_MINOR: c_int = 76;

extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(library: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *const c_char;
}

/// The driver entry points, each named after its exported symbol.
macro_rules! driver_api {
    ($($symbol:ident($($arg:ty),*);)*) => {
        #[allow(non_snake_case)]
        struct Api {
            $($symbol: unsafe extern "C" fn($($arg),*) -> CuResult,)*
        }

        impl Api {
            /// # Safety
            /// `library` is a handle from dlopen of libcuda.
            unsafe fn load(library: *mut c_void) -> Result<Api, String> {
                Ok(Api { $($symbol: symbol(library, concat!(stringify!($symbol), "\0"))?,)* })
            }
        }
    };
}

driver_api! {
    cuInit(c_uint);
    cuDeviceGetCount(*mut c_int);
    cuDeviceGet(*mut CuDevice, c_int);
    cuDeviceGetAttribute(*mut c_int, c_int, CuDevice);
    cuDevicePrimaryCtxRetain(*mut CuContext, CuDevice);
    cuCtxSetCurrent(CuContext);
    cuCtxSynchronize();
    cuMemAlloc_v2(*mut u64, usize);
    cuMemFree_v2(u64);
    cuMemsetD8_v2(u64, u8, usize);
    cuMemcpyHtoD_v2(u64, *const c_void, usize);
    cuMemcpyDtoH_v2(*mut c_void, u64, usize);
    cuStreamCreate(*mut CuStream, c_uint);
    cuStreamSynchronize(CuStream);
    cuStreamDestroy_v2(CuStream);
    cuGetErrorName(CuResult, *mut *const c_char);
}

/// # Safety
/// `name` is NUL-terminated and `T` is the function-pointer type of the symbol.
unsafe fn symbol<T>(library: *mut c_void, name: &str) -> Result<T, String> {
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    let address = dlsym(library, name.as_ptr().cast());
    if address.is_null() {
        return Err(format!("libcuda.so.1 has no {}", name.trim_end_matches('\0')));
    }
    Ok(std::mem::transmute_copy(&address))
}

/// Device 0's primary context (the one the CUDA runtime inside flashcore uses).
pub struct Gpu {
    api: Api,
    context: CuContext,
    /// How many devices the driver sees.
    pub devices: i32,
    /// Device 0's compute capability, (major, minor): (9, 0) for H100 and H200.
    pub compute_capability: (i32, i32),
}

// SAFETY: a CUDA context may be used from any thread once made current there.
unsafe impl Send for Gpu {}
// SAFETY: as above; the driver API is thread-safe.
unsafe impl Sync for Gpu {}

/// The GPU, or why there is none (driver missing, no device visible, ...).
pub fn gpu() -> Result<&'static Gpu, String> {
    // Opened once, then leaked for 'static (a Mutex, not OnceLock: Rust 1.63).
    static GPU: Mutex<Option<&'static Result<Gpu, String>>> = Mutex::new(None);
    let opened = *GPU.lock().unwrap().get_or_insert_with(|| Box::leak(Box::new(unsafe { Gpu::open() })));
    let gpu = opened.as_ref().map_err(Clone::clone)?;
    gpu.bind();
    Ok(gpu)
}

impl Gpu {
    unsafe fn open() -> Result<Gpu, String> {
        let library = dlopen(b"libcuda.so.1\0".as_ptr().cast(), RTLD_NOW);
        if library.is_null() {
            let why = dlerror();
            let why = if why.is_null() { "unknown error".into() } else { CStr::from_ptr(why).to_string_lossy() };
            return Err(format!("no CUDA driver: {why}"));
        }
        let mut gpu =
            Gpu { api: Api::load(library)?, context: std::ptr::null_mut(), devices: 0, compute_capability: (0, 0) };
        gpu.result("cuInit", (gpu.api.cuInit)(0))?;
        let mut devices = 0;
        gpu.result("cuDeviceGetCount", (gpu.api.cuDeviceGetCount)(&mut devices))?;
        gpu.devices = devices;
        if gpu.devices == 0 {
            return Err("the CUDA driver sees no device".into());
        }
        let (mut device, mut context) = (0, std::ptr::null_mut());
        gpu.result("cuDeviceGet", (gpu.api.cuDeviceGet)(&mut device, 0))?;
        let (mut major, mut minor) = (0, 0);
        gpu.result(
            "cuDeviceGetAttribute",
            (gpu.api.cuDeviceGetAttribute)(&mut major, COMPUTE_CAPABILITY_MAJOR, device),
        )?;
        gpu.result(
            "cuDeviceGetAttribute",
            (gpu.api.cuDeviceGetAttribute)(&mut minor, COMPUTE_CAPABILITY_MINOR, device),
        )?;
        gpu.compute_capability = (major, minor);
        gpu.result("cuDevicePrimaryCtxRetain", (gpu.api.cuDevicePrimaryCtxRetain)(&mut context, device))?;
        gpu.context = context;
        Ok(gpu)
    }

    fn result(&self, call: &str, result: CuResult) -> Result<(), String> {
        if result == 0 {
            return Ok(());
        }
        let mut name = std::ptr::null();
        // SAFETY: valid out-pointer; the driver returns a static string.
        let name = match unsafe { (self.api.cuGetErrorName)(result, &mut name) } {
            0 if !name.is_null() => unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned(),
            _ => format!("CUresult {result}"),
        };
        Err(format!("{call} failed: {name}"))
    }

    /// Panics with the driver's error name unless `result` is success.
    fn check(&self, call: &str, result: CuResult) {
        if let Err(why) = self.result(call, result) {
            panic!("{why}");
        }
    }

    /// Makes the context current on the calling thread.
    fn bind(&self) {
        // SAFETY: a retained context.
        self.check("cuCtxSetCurrent", unsafe { (self.api.cuCtxSetCurrent)(self.context) });
    }

    /// `bytes` of device memory filled with 0xFF bytes (NaN in every float format).
    pub fn alloc_poisoned(&self, bytes: usize) -> DeviceMemory<'_> {
        let mut ptr = 0;
        // SAFETY: valid out-pointer; then memset of the whole new allocation.
        self.check("cuMemAlloc", unsafe { (self.api.cuMemAlloc_v2)(&mut ptr, bytes.max(1)) });
        self.check("cuMemsetD8", unsafe { (self.api.cuMemsetD8_v2)(ptr, 0xFF, bytes) });
        DeviceMemory { gpu: self, ptr, bytes }
    }

    /// Device memory holding a copy of `data`.
    pub fn upload<T: Copy>(&self, data: &[T]) -> DeviceMemory<'_> {
        let memory = self.alloc_poisoned(std::mem::size_of_val(data));
        // SAFETY: the allocation holds exactly the bytes of `data`.
        self.check("cuMemcpyHtoD", unsafe {
            (self.api.cuMemcpyHtoD_v2)(memory.ptr, data.as_ptr().cast(), memory.bytes)
        });
        memory
    }

    /// The contents of `memory`, as `T`s (plain integer or float types only).
    pub fn download<T: Copy + Default>(&self, memory: &DeviceMemory<'_>) -> Vec<T> {
        let mut host = vec![T::default(); memory.bytes / std::mem::size_of::<T>()];
        // SAFETY: copies size_of_val(host) <= bytes bytes into `host`.
        self.check("cuMemcpyDtoH", unsafe {
            (self.api.cuMemcpyDtoH_v2)(host.as_mut_ptr().cast(), memory.ptr, std::mem::size_of_val(host.as_slice()))
        });
        host
    }

    /// A new stream, synchronised with the legacy default stream.
    pub fn stream(&self) -> Stream<'_> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer; flags 0 is CU_STREAM_DEFAULT.
        self.check("cuStreamCreate", unsafe { (self.api.cuStreamCreate)(&mut raw, 0) });
        Stream { gpu: self, raw }
    }

    /// Waits for all work on the device; panics on an asynchronous error.
    pub fn synchronize(&self) {
        // SAFETY: no arguments.
        self.check("cuCtxSynchronize", unsafe { (self.api.cuCtxSynchronize)() });
    }
}

/// A device allocation, freed on drop, usable as a flashcore buffer.
pub struct DeviceMemory<'g> {
    gpu: &'g Gpu,
    ptr: u64,
    bytes: usize,
}

impl flashcore::DeviceBuffer for DeviceMemory<'_> {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }

    fn byte_len(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceMemory<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc; callers synchronize before dropping.
        // A failure is not checked: this may run while a failed test unwinds.
        unsafe { (self.gpu.api.cuMemFree_v2)(self.ptr) };
    }
}

/// A CUDA stream, destroyed on drop.
pub struct Stream<'g> {
    gpu: &'g Gpu,
    /// The `CUstream`.
    pub raw: CuStream,
}

impl Stream<'_> {
    /// Waits for the stream's work; panics on an asynchronous error.
    pub fn synchronize(&self) {
        // SAFETY: a live stream.
        self.gpu.check("cuStreamSynchronize", unsafe { (self.gpu.api.cuStreamSynchronize)(self.raw) });
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        // SAFETY: a live stream, not used after this. Not checked, as above.
        unsafe { (self.gpu.api.cuStreamDestroy_v2)(self.raw) };
    }
}
