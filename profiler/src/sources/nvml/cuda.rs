//! The CUDA driver API, loaded at run time, for one thing: holding a
//! context on a GPU, so that `wattprof calibrate` can measure what an open
//! context costs (the held power) without PyTorch. Loaded as cudarc loads
//! it (`libcuda.so.1` through `dlopen`, each symbol looked up), so a
//! machine with no CUDA driver, or a build machine with no CUDA at all,
//! gets a clear line instead of a link error. Six calls; a whole binding
//! crate would add tens of thousands of generated lines for them.

use std::ffi::{OsStr, c_char, c_int, c_uint, c_void};

use libloading::{Library, Symbol};

type CuResult = c_uint;
type CuDevice = c_int;
type CuContext = *mut c_void;

/// The driver's library, initialised. It is never unloaded: the driver
/// starts threads of its own at `cuInit`, and `dlclose` under them is
/// undefined (cudarc keeps its library for the process's life too).
#[derive(Debug)]
pub(crate) struct Cuda {
    lib: std::mem::ManuallyDrop<Library>,
}

/// A context on one GPU, destroyed when dropped.
#[derive(Debug)]
pub(crate) struct Context<'a> {
    cuda: &'a Cuda,
    ctx: CuContext,
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: the symbol's C signature; a context this value created.
        if let Ok(destroy) = unsafe {
            self.cuda
                .lib
                .get::<unsafe extern "C" fn(CuContext) -> CuResult>(b"cuCtxDestroy_v2\0")
        } {
            // SAFETY: as above; destroyed once.
            unsafe { destroy(self.ctx) };
        }
    }
}

impl Cuda {
    /// Loads the driver API from `lib` (default `libcuda.so.1`) and
    /// initialises it: one line saying why not.
    pub(crate) fn open(lib: Option<&OsStr>) -> Result<Self, String> {
        let path = lib.unwrap_or(OsStr::new("libcuda.so.1"));
        // SAFETY: loading the CUDA driver library runs its initialisers,
        // which have no preconditions.
        let lib = unsafe { Library::new(path) }.map_err(|e| {
            format!(
                "no CUDA driver library ({}: {e}); it comes with the NVIDIA driver",
                path.to_string_lossy()
            )
        })?;
        let cuda = Self {
            lib: std::mem::ManuallyDrop::new(lib),
        };
        // SAFETY: cuInit(unsigned int) -> CUresult.
        let init: Symbol<unsafe extern "C" fn(c_uint) -> CuResult> =
            unsafe { cuda.sym(b"cuInit\0") }?;
        // SAFETY: flags must be 0.
        cuda.check(unsafe { init(0) }, "cuInit")?;
        Ok(cuda)
    }

    /// # Safety
    /// `T` must be the C signature of the symbol `name`.
    unsafe fn sym<T>(&self, name: &[u8]) -> Result<Symbol<'_, T>, String> {
        // SAFETY: the caller's contract.
        unsafe { self.lib.get::<T>(name) }.map_err(|e| {
            format!(
                "the CUDA driver library has no {} ({e})",
                String::from_utf8_lossy(name.strip_suffix(b"\0").unwrap_or(name))
            )
        })
    }

    /// An error code's name (`CUDA_ERROR_NO_DEVICE`), or its number.
    fn name(&self, rc: CuResult) -> String {
        // SAFETY: cuGetErrorName(CUresult, const char**) -> CUresult.
        let f: Result<Symbol<unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult>, _> =
            unsafe { self.sym(b"cuGetErrorName\0") };
        let mut s: *const c_char = std::ptr::null();
        match f {
            // SAFETY: a valid out-pointer; the driver's string is static.
            Ok(f) if unsafe { f(rc, &mut s) } == 0 && !s.is_null() => {
                // SAFETY: NUL-terminated, static (CUDA's documentation).
                unsafe { std::ffi::CStr::from_ptr(s) }
                    .to_string_lossy()
                    .into_owned()
            }
            _ => format!("CUDA error {rc}"),
        }
    }

    fn check(&self, rc: CuResult, what: &str) -> Result<(), String> {
        if rc == 0 {
            Ok(())
        } else {
            Err(format!("{what} failed: {}", self.name(rc)))
        }
    }

    /// Each CUDA device's UUID in NVML's spelling (`GPU-xxxxxxxx-...`),
    /// by CUDA ordinal: CUDA's order (and `CUDA_VISIBLE_DEVICES`) need not
    /// be NVML's, so a GPU is matched by UUID, never by number.
    pub(crate) fn devices(&self) -> Result<Vec<(CuDevice, String)>, String> {
        // SAFETY: the C signatures of these calls.
        let count: Symbol<unsafe extern "C" fn(*mut c_int) -> CuResult> =
            unsafe { self.sym(b"cuDeviceGetCount\0") }?;
        // SAFETY: as above.
        let get: Symbol<unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult> =
            unsafe { self.sym(b"cuDeviceGet\0") }?;
        // SAFETY: as above (CUuuid is 16 bytes).
        let uuid: Symbol<unsafe extern "C" fn(*mut u8, CuDevice) -> CuResult> =
            match unsafe { self.sym(b"cuDeviceGetUuid_v2\0") } {
                Ok(f) => f,
                // SAFETY: as above.
                Err(_) => unsafe { self.sym(b"cuDeviceGetUuid\0") }?,
            };
        let mut n: c_int = 0;
        // SAFETY: a valid out-pointer.
        self.check(unsafe { count(&mut n) }, "cuDeviceGetCount")?;
        let mut out = Vec::new();
        for ordinal in 0..n.clamp(0, 64) {
            let mut dev: CuDevice = 0;
            // SAFETY: a valid out-pointer and an ordinal below the count.
            self.check(unsafe { get(&mut dev, ordinal) }, "cuDeviceGet")?;
            let mut bytes = [0u8; 16];
            // SAFETY: a 16-byte buffer.
            self.check(unsafe { uuid(bytes.as_mut_ptr(), dev) }, "cuDeviceGetUuid")?;
            out.push((dev, nvml_uuid(&bytes)));
        }
        Ok(out)
    }

    /// Opens a context on `dev` (it is current on this thread until
    /// dropped).
    pub(crate) fn context(&self, dev: CuDevice) -> Result<Context<'_>, String> {
        // SAFETY: cuCtxCreate_v2(CUcontext*, unsigned int, CUdevice).
        let create: Symbol<unsafe extern "C" fn(*mut CuContext, c_uint, CuDevice) -> CuResult> =
            unsafe { self.sym(b"cuCtxCreate_v2\0") }?;
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer, default flags, a device from cuDeviceGet.
        self.check(unsafe { create(&mut ctx, 0, dev) }, "cuCtxCreate")?;
        Ok(Context { cuda: self, ctx })
    }
}

/// 16 UUID bytes as NVML writes them: `GPU-` and 8-4-4-4-12 hex digits.
pub(crate) fn nvml_uuid(b: &[u8; 16]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cuda_uuid_is_spelled_as_nvml_spells_it() {
        let b = [
            0x6a, 0x3c, 0x0f, 0x0e, 0x1b, 0x2d, 0x4c, 0x5e, 0x8f, 0x90, 0x01, 0x23, 0x45, 0x67,
            0x89, 0xab,
        ];
        assert_eq!(
            super::nvml_uuid(&b),
            "GPU-6a3c0f0e-1b2d-4c5e-8f90-0123456789ab"
        );
    }

    #[test]
    fn no_cuda_library_is_one_line_saying_where_it_comes_from() {
        let e = super::Cuda::open(Some(std::ffi::OsStr::new("/nonexistent/libcuda.so.1")))
            .expect_err("no library");
        assert!(e.contains("NVIDIA driver") && !e.contains('\n'), "{e}");
    }
}
