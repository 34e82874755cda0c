//! Raw CUDA driver API: the types, constants and entry points gdr uses, resolved from
//! `libcuda.so.1` at run time (nothing links against CUDA at build time).
//!
//! Everything here is a faithful, unchecked mirror of `cuda.h` (CUDA 12/13 ABI). The safe layer
//! is in [`super`]; only it calls these pointers.

#![allow(non_camel_case_types)]

use crate::dylib::api_table;
use std::ffi::{c_char, c_int, c_uint, c_void};

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUexternalMemory = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;

// CUdevice_attribute values used by gdr.
pub const ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
pub const ATTR_INTEGRATED: c_int = 18;
pub const ATTR_CAN_MAP_HOST_MEMORY: c_int = 19;
pub const ATTR_PCI_BUS_ID: c_int = 33;
pub const ATTR_PCI_DEVICE_ID: c_int = 34;
pub const ATTR_UNIFIED_ADDRESSING: c_int = 41;
pub const ATTR_PCI_DOMAIN_ID: c_int = 50;
pub const ATTR_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub const ATTR_COMPUTE_CAPABILITY_MINOR: c_int = 76;
pub const ATTR_PAGEABLE_MEMORY_ACCESS: c_int = 88;
pub const ATTR_CAN_USE_STREAM_MEM_OPS_V1: c_int = 92;
pub const ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: c_int = 97;
pub const ATTR_HOST_REGISTER_SUPPORTED: c_int = 99;
pub const ATTR_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 102;
pub const ATTR_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: c_int = 103;
pub const ATTR_GPU_DIRECT_RDMA_SUPPORTED: c_int = 116;
pub const ATTR_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: c_int = 117;
pub const ATTR_GPU_DIRECT_RDMA_WRITES_ORDERING: c_int = 118;
pub const ATTR_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: c_int = 110;
pub const ATTR_DMA_BUF_SUPPORTED: c_int = 124;
/// The SM clock's peak rate, kHz (what `clock64` counts at full speed).
pub const ATTR_CLOCK_RATE: c_int = 13;

// CUfunction_attribute values.
pub const FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_int = 0;
pub const FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;
/// The cluster width the kernel was compiled for (`__cluster_dims__`); 0 when it has none.
pub const FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH: c_int = 11;

// CUpointer_attribute values.
pub const POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
pub const POINTER_ATTRIBUTE_SYNC_MEMOPS: c_int = 6;
pub const POINTER_ATTRIBUTE_BUFFER_ID: c_int = 7;
pub const POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;

// CUmemorytype values.
pub const MEMORYTYPE_HOST: u32 = 1;

// cuMemHostAlloc / cuMemHostRegister flags.
pub const MEMHOSTALLOC_PORTABLE: c_uint = 0x1;
pub const MEMHOSTALLOC_DEVICEMAP: c_uint = 0x2;
pub const MEMHOSTALLOC_WRITECOMBINED: c_uint = 0x4;

// Streams, events, graphs.
pub const STREAM_NON_BLOCKING: c_uint = 0x1;
pub const EVENT_DEFAULT: c_uint = 0x0;
pub const STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;

// External memory.
pub const EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD: c_uint = 1;

// cuMemGetHandleForAddressRange.
pub const MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 1;
pub const MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE: u64 = 1;

// Virtual memory management (cuMemCreate and friends).
pub type CUmemGenericAllocationHandle = u64;
pub const MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
pub const MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_int = 1;
pub const MEM_LOCATION_TYPE_DEVICE: c_int = 1;
pub const MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;
pub const MEM_ALLOC_GRANULARITY_MINIMUM: c_int = 0;

/// `CUmemLocation`: 8 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp`: 32 bytes; `allocFlags` is the 8-byte tail.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAccessDesc`: 12 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_int,
}

/// `CUDA_EXTERNAL_MEMORY_HANDLE_DESC`: 104 bytes; the handle union (fd, win32 pair, NvSciBuf
/// pointer) is 16 bytes at offset 8.
#[repr(C)]
pub struct CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
    pub type_: c_uint,
    pub _pad: c_uint,
    /// The handle union; for an fd, the fd sits in the low 4 bytes of `handle[0]`.
    pub handle: [u64; 2],
    pub size: u64,
    pub flags: c_uint,
    pub reserved: [c_uint; 16],
}

/// `CUDA_EXTERNAL_MEMORY_BUFFER_DESC`: 88 bytes.
#[repr(C)]
pub struct CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
    pub offset: u64,
    pub size: u64,
    pub flags: c_uint,
    pub reserved: [c_uint; 16],
}

/// `CUlaunchConfig`: 56 bytes. Only for occupancy queries here (no attributes: a kernel's
/// compile-time cluster size applies by itself).
#[repr(C)]
pub struct CUlaunchConfig {
    pub grid_dim: [c_uint; 3],
    pub block_dim: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

api_table! {
    /// The driver entry points, resolved once from the loaded library.
    pub struct DriverApi {
        init = "cuInit"(c_uint) -> CUresult;
        driver_get_version = "cuDriverGetVersion"(*mut c_int) -> CUresult;
        get_error_name = "cuGetErrorName"(CUresult, *mut *const c_char) -> CUresult;
        get_error_string = "cuGetErrorString"(CUresult, *mut *const c_char) -> CUresult;
        device_get_count = "cuDeviceGetCount"(*mut c_int) -> CUresult;
        device_get = "cuDeviceGet"(*mut CUdevice, c_int) -> CUresult;
        device_get_name = "cuDeviceGetName"(*mut c_char, c_int, CUdevice) -> CUresult;
        device_get_attribute = "cuDeviceGetAttribute"(*mut c_int, c_int, CUdevice) -> CUresult;
        device_total_mem = "cuDeviceTotalMem_v2"(*mut usize, CUdevice) -> CUresult;
        device_get_uuid = "cuDeviceGetUuid_v2"(*mut [u8; 16], CUdevice) -> CUresult;
        device_primary_ctx_retain = "cuDevicePrimaryCtxRetain"(*mut CUcontext, CUdevice) -> CUresult;
        device_primary_ctx_release = "cuDevicePrimaryCtxRelease_v2"(CUdevice) -> CUresult;
        ctx_set_current = "cuCtxSetCurrent"(CUcontext) -> CUresult;
        ctx_get_current = "cuCtxGetCurrent"(*mut CUcontext) -> CUresult;
        ctx_push_current = "cuCtxPushCurrent_v2"(CUcontext) -> CUresult;
        ctx_pop_current = "cuCtxPopCurrent_v2"(*mut CUcontext) -> CUresult;
        ctx_synchronize = "cuCtxSynchronize"() -> CUresult;
        device_can_access_peer = "cuDeviceCanAccessPeer"(*mut c_int, CUdevice, CUdevice) -> CUresult;
        mem_get_info = "cuMemGetInfo_v2"(*mut usize, *mut usize) -> CUresult;
        mem_alloc = "cuMemAlloc_v2"(*mut CUdeviceptr, usize) -> CUresult;
        mem_free = "cuMemFree_v2"(CUdeviceptr) -> CUresult;
        mem_alloc_host = "cuMemHostAlloc"(*mut *mut c_void, usize, c_uint) -> CUresult;
        mem_free_host = "cuMemFreeHost"(*mut c_void) -> CUresult;
        mem_host_get_device_pointer = "cuMemHostGetDevicePointer_v2"(*mut CUdeviceptr, *mut c_void, c_uint) -> CUresult;
        memcpy_htod = "cuMemcpyHtoD_v2"(CUdeviceptr, *const c_void, usize) -> CUresult;
        memcpy_dtoh = "cuMemcpyDtoH_v2"(*mut c_void, CUdeviceptr, usize) -> CUresult;
        memcpy_htod_async = "cuMemcpyHtoDAsync_v2"(CUdeviceptr, *const c_void, usize, CUstream) -> CUresult;
        memcpy_dtoh_async = "cuMemcpyDtoHAsync_v2"(*mut c_void, CUdeviceptr, usize, CUstream) -> CUresult;
        memset_d8 = "cuMemsetD8_v2"(CUdeviceptr, u8, usize) -> CUresult;
        mem_get_address_range = "cuMemGetAddressRange_v2"(*mut CUdeviceptr, *mut usize, CUdeviceptr) -> CUresult;
        pointer_get_attribute = "cuPointerGetAttribute"(*mut c_void, c_int, CUdeviceptr) -> CUresult;
        pointer_set_attribute = "cuPointerSetAttribute"(*const c_void, c_int, CUdeviceptr) -> CUresult;
        mem_get_handle_for_address_range = "cuMemGetHandleForAddressRange"(*mut c_void, CUdeviceptr, usize, c_int, u64) -> CUresult;
        stream_create = "cuStreamCreate"(*mut CUstream, c_uint) -> CUresult;
        stream_destroy = "cuStreamDestroy_v2"(CUstream) -> CUresult;
        stream_synchronize = "cuStreamSynchronize"(CUstream) -> CUresult;
        stream_query = "cuStreamQuery"(CUstream) -> CUresult;
        stream_begin_capture = "cuStreamBeginCapture_v2"(CUstream, c_int) -> CUresult;
        stream_end_capture = "cuStreamEndCapture"(CUstream, *mut CUgraph) -> CUresult;
        graph_instantiate = "cuGraphInstantiateWithFlags"(*mut CUgraphExec, CUgraph, u64) -> CUresult;
        graph_launch = "cuGraphLaunch"(CUgraphExec, CUstream) -> CUresult;
        graph_exec_destroy = "cuGraphExecDestroy"(CUgraphExec) -> CUresult;
        graph_destroy = "cuGraphDestroy"(CUgraph) -> CUresult;
        event_create = "cuEventCreate"(*mut CUevent, c_uint) -> CUresult;
        event_record = "cuEventRecord"(CUevent, CUstream) -> CUresult;
        event_synchronize = "cuEventSynchronize"(CUevent) -> CUresult;
        event_elapsed_time = "cuEventElapsedTime"(*mut f32, CUevent, CUevent) -> CUresult;
        event_destroy = "cuEventDestroy_v2"(CUevent) -> CUresult;
        module_load_data = "cuModuleLoadData"(*mut CUmodule, *const c_void) -> CUresult;
        module_unload = "cuModuleUnload"(CUmodule) -> CUresult;
        module_get_function = "cuModuleGetFunction"(*mut CUfunction, CUmodule, *const c_char) -> CUresult;
        func_set_attribute = "cuFuncSetAttribute"(CUfunction, c_int, c_int) -> CUresult;
        func_get_attribute = "cuFuncGetAttribute"(*mut c_int, c_int, CUfunction) -> CUresult;
        occupancy_max_active_clusters = "cuOccupancyMaxActiveClusters"(*mut c_int, CUfunction, *const CUlaunchConfig) -> CUresult;
        launch_kernel = "cuLaunchKernel"(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult;
        import_external_memory = "cuImportExternalMemory"(*mut CUexternalMemory, *const CUDA_EXTERNAL_MEMORY_HANDLE_DESC) -> CUresult;
        external_memory_get_mapped_buffer = "cuExternalMemoryGetMappedBuffer"(*mut CUdeviceptr, CUexternalMemory, *const CUDA_EXTERNAL_MEMORY_BUFFER_DESC) -> CUresult;
        destroy_external_memory = "cuDestroyExternalMemory"(CUexternalMemory) -> CUresult;
        mem_get_allocation_granularity = "cuMemGetAllocationGranularity"(*mut usize, *const CUmemAllocationProp, c_int) -> CUresult;
        mem_create = "cuMemCreate"(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, u64) -> CUresult;
        mem_release = "cuMemRelease"(CUmemGenericAllocationHandle) -> CUresult;
        mem_address_reserve = "cuMemAddressReserve"(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64) -> CUresult;
        mem_address_free = "cuMemAddressFree"(CUdeviceptr, usize) -> CUresult;
        mem_map = "cuMemMap"(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64) -> CUresult;
        mem_unmap = "cuMemUnmap"(CUdeviceptr, usize) -> CUresult;
        mem_set_access = "cuMemSetAccess"(CUdeviceptr, usize, *const CUmemAccessDesc, usize) -> CUresult;
        mem_export_to_shareable_handle = "cuMemExportToShareableHandle"(*mut c_void, CUmemGenericAllocationHandle, c_int, u64) -> CUresult;
        mem_retain_allocation_handle = "cuMemRetainAllocationHandle"(*mut CUmemGenericAllocationHandle, *mut c_void) -> CUresult;
        mem_get_allocation_properties_from_handle = "cuMemGetAllocationPropertiesFromHandle"(*mut CUmemAllocationProp, CUmemGenericAllocationHandle) -> CUresult;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_memory_descriptors_match_cuda_h() {
        assert_eq!(std::mem::size_of::<CUDA_EXTERNAL_MEMORY_HANDLE_DESC>(), 104);
        assert_eq!(
            std::mem::offset_of!(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, handle),
            8
        );
        assert_eq!(
            std::mem::offset_of!(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, size),
            24
        );
        assert_eq!(
            std::mem::offset_of!(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, flags),
            32
        );
        assert_eq!(std::mem::size_of::<CUDA_EXTERNAL_MEMORY_BUFFER_DESC>(), 88);
        assert_eq!(std::mem::size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(std::mem::offset_of!(CUmemAllocationProp, location), 8);
        assert_eq!(
            std::mem::offset_of!(CUmemAllocationProp, win32_handle_meta_data),
            16
        );
        assert_eq!(
            std::mem::offset_of!(CUmemAllocationProp, gpu_direct_rdma_capable),
            25
        );
        assert_eq!(std::mem::size_of::<CUmemAccessDesc>(), 12);
        assert_eq!(std::mem::size_of::<CUlaunchConfig>(), 56);
        assert_eq!(std::mem::offset_of!(CUlaunchConfig, stream), 32);
        assert_eq!(std::mem::offset_of!(CUlaunchConfig, num_attrs), 48);
        assert_eq!(
            std::mem::offset_of!(CUDA_EXTERNAL_MEMORY_BUFFER_DESC, flags),
            16
        );
    }
}
