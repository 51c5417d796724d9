/*
 * The few CUDA driver API and NVML types hami-jupyter needs, declared here so
 * that the preload library and the simulated GPU build with the system C
 * compiler alone (no CUDA toolkit, no CUDA headers). Values and layouts follow
 * the public ABI of libcuda.so.1 (CUDA 12/13) and libnvidia-ml.so.1.
 */
#ifndef HAMI_CUDA_TYPES_H
#define HAMI_CUDA_TYPES_H

#include <stddef.h>
#include <stdint.h>

/* ---- CUDA driver API ---------------------------------------------------- */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef unsigned int cuuint32_t;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUevent_st *CUevent;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_DEINITIALIZED = 4,
	CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
	CUDA_ERROR_INVALID_IMAGE = 200,
	CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
	CUDA_ERROR_OPERATING_SYSTEM = 304,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_ILLEGAL_STATE = 401,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_ILLEGAL_ADDRESS = 700, /* a kernel or copy touched memory it may not: sticky on its context */
	CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
	CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705,
	CUDA_ERROR_NOT_PERMITTED = 800,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_TIMEOUT = 909,
	CUDA_ERROR_UNKNOWN = 999
};

typedef struct CUuuid_st {
	char bytes[16];
} CUuuid;

/* cuGetProcAddress flags and results. */
enum {
	CU_GET_PROC_ADDRESS_DEFAULT = 0,
	CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
	CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2
};
typedef enum {
	CU_GET_PROC_ADDRESS_SUCCESS = 0,
	CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
	CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;

/* cuDeviceGetAttribute: only the attributes this project asks for. */
enum {
	CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
	CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
	CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20,
	CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
	CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
	CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
};

/* CU_DEVICE_ATTRIBUTE_COMPUTE_MODE's values */
enum {
	CU_COMPUTEMODE_DEFAULT = 0,
	CU_COMPUTEMODE_PROHIBITED = 2,
	CU_COMPUTEMODE_EXCLUSIVE_PROCESS = 3
};

typedef enum {
	CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
	CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
	CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
	CU_AD_FORMAT_SIGNED_INT8 = 0x08,
	CU_AD_FORMAT_SIGNED_INT16 = 0x09,
	CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
	CU_AD_FORMAT_HALF = 0x10,
	CU_AD_FORMAT_FLOAT = 0x20
} CUarray_format;

typedef struct {
	size_t Width;
	size_t Height;
	CUarray_format Format;
	unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
	size_t Width;
	size_t Height;
	size_t Depth;
	CUarray_format Format;
	unsigned int NumChannels;
	unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef enum {
	CU_MEM_LOCATION_TYPE_INVALID = 0,
	CU_MEM_LOCATION_TYPE_DEVICE = 1,
	CU_MEM_LOCATION_TYPE_HOST = 2,
	CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
	CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4
} CUmemLocationType;

typedef struct {
	CUmemLocationType type;
	int id;
} CUmemLocation;

typedef struct {
	int type;                 /* CUmemAllocationType: 1 = pinned */
	int requestedHandleTypes; /* CUmemAllocationHandleType */
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

/* Virtual memory management (CUDA 10.2): an address range is reserved
 * (cuMemAddressReserve), physical memory made (cuMemCreate) and mapped into it
 * (cuMemMap), and each device given access (cuMemSetAccess) before use. */
typedef enum {
	CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
	CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
} CUmemAllocationGranularity_flags;

typedef enum {
	CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
	CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
	CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
} CUmemAccess_flags;

typedef struct {
	CUmemLocation location;
	CUmemAccess_flags flags;
} CUmemAccessDesc;

enum { CU_MEM_ALLOCATION_TYPE_PINNED = 1 }; /* CUmemAllocationProp.type */

/* cuPointerGetAttribute(s) */
typedef enum {
	CU_POINTER_ATTRIBUTE_CONTEXT = 1,
	CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
	CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
	CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
	CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
	CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
	CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
	CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
	CU_POINTER_ATTRIBUTE_MAPPED = 13,
	CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES = 14,
	CU_POINTER_ATTRIBUTE_ACCESS_FLAGS = 16,
	CU_POINTER_ATTRIBUTE_MAPPING_SIZE = 18,
	CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR = 19
} CUpointer_attribute;

enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2 };

/* cuIpcGetMemHandle's handle: 64 opaque bytes. */
typedef struct {
	char reserved[64];
} CUipcMemHandle;

/* cuMemHostAlloc flags: page-locked host memory the device copies from at full speed. */
enum { CU_MEMHOSTALLOC_PORTABLE = 0x01 };

/* cuMemPoolGetAttribute attributes used to follow pool growth. */
typedef enum {
	CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
	CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
	CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
	CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
	CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
	CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
	CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
	CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8
} CUmemPool_attribute;

enum { CU_MEM_ATTACH_GLOBAL = 1, CU_MEM_ATTACH_HOST = 2 };

/* Stream capture interaction modes (cuThreadExchangeStreamCaptureMode). */
enum {
	CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
	CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
	CU_STREAM_CAPTURE_MODE_RELAXED = 2
};

/* Stream memory operations (cuStreamWaitValue32 / cuStreamWriteValue32, and
 * their _v2 forms since CUDA 11.7): a stream waits until a 32-bit word in
 * device memory meets a condition, or writes one when it gets there. */
typedef enum {
	CU_STREAM_WAIT_VALUE_GEQ = 0x0, /* (int32_t)(*addr - value) >= 0 */
	CU_STREAM_WAIT_VALUE_EQ = 0x1,
	CU_STREAM_WAIT_VALUE_AND = 0x2, /* (*addr & value) != 0 */
	CU_STREAM_WAIT_VALUE_NOR = 0x3, /* ~(*addr | value) != 0 */
	CU_STREAM_WAIT_VALUE_FLUSH = 1 << 30
} CUstreamWaitValue_flags;

typedef enum {
	CU_STREAM_WRITE_VALUE_DEFAULT = 0x0,
	CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER = 0x1
} CUstreamWriteValue_flags;

enum { CU_STREAM_DEFAULT = 0x0, CU_STREAM_NON_BLOCKING = 0x1 };

/* cuDeviceGetGraphMemAttribute / cuDeviceSetGraphMemAttribute (CUDA 11.4):
 * the device's graph memory pool, values cuuint64_t. */
typedef enum {
	CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0,     /* bytes associated with graphs now */
	CU_GRAPH_MEM_ATTR_USED_MEM_HIGH = 1,        /* its high watermark (reset by setting 0) */
	CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2, /* bytes the graph allocator holds */
	CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH = 3     /* its high watermark (reset by setting 0) */
} CUgraphMem_attribute;

/* A graph's nodes, as far as its memory goes (cuGraphNodeGetType). */
enum {
	CU_GRAPH_NODE_TYPE_GRAPH = 4,     /* a child graph */
	CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
	CU_GRAPH_NODE_TYPE_MEM_FREE = 11
};

/* CUmemPoolProps (CUDA 12), 88 bytes: CUDA 11 had reserved[64] where maxSize
 * is, which callers had to zero, so reading maxSize is safe for both. */
typedef struct {
	int allocType;
	int handleTypes;
	CUmemLocation location;
	void *win32SecurityAttributes;
	size_t maxSize;
	unsigned short usage;
	unsigned char reserved[54];
} CUmemPoolProps;

/* cuGraphMemAllocNodeGetParams (CUDA 11.4) */
typedef struct {
	CUmemPoolProps poolProps;
	const void *accessDescs;
	size_t accessDescCount;
	size_t bytesize;
	CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;

/* cuGraphInstantiateWithParams (CUDA 12.0) */
enum {
	CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH = 1,
	CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD = 2 /* the memory is mapped at instantiation */
};
typedef struct {
	cuuint64_t flags;
	CUstream hUploadStream;
	CUgraphNode hErrNode_out;
	int result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

/* The process checkpoint API (driver 550+): one process moves another's GPU
 * state to host memory and back. The args are optional (NULL: defaults). */
typedef enum {
	CU_PROCESS_STATE_RUNNING = 0,      /* CUDA calls run */
	CU_PROCESS_STATE_LOCKED = 1,       /* CUDA calls block until unlocked */
	CU_PROCESS_STATE_CHECKPOINTED = 2, /* GPU memory moved to host memory, device handles released */
	CU_PROCESS_STATE_FAILED = 3
} CUprocessState;

typedef struct CUcheckpointLockArgs_st {
	unsigned int timeoutMs; /* 0: no timeout */
	unsigned int reserved0;
	cuuint64_t reserved1[7];
} CUcheckpointLockArgs;
typedef struct CUcheckpointCheckpointArgs_st CUcheckpointCheckpointArgs;
typedef struct CUcheckpointRestoreArgs_st CUcheckpointRestoreArgs;
typedef struct CUcheckpointUnlockArgs_st CUcheckpointUnlockArgs;

/* ---- NVML ----------------------------------------------------------------- */

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_NO_PERMISSION = 4,
	NVML_ERROR_NOT_FOUND = 6,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_FUNCTION_NOT_FOUND = 13,
	NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
	NVML_ERROR_MEMORY = 20,
	NVML_ERROR_UNKNOWN = 999
};

#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96

typedef struct {
	unsigned long long total;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_t;

typedef struct {
	unsigned int version; /* nvmlMemory_v2 */
	unsigned long long total;
	unsigned long long reserved;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_v2_t;

/* NVML_STRUCT_VERSION(Memory, 2) */
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
	unsigned int gpu;
	unsigned int memory;
} nvmlUtilization_t;

/* nvmlDevice{Compute,Graphics,MPSCompute}RunningProcesses (v1) element. A tag
 * only: the simulated GPU's header has its own nvmlProcessInfo_v1_t. */
struct nvmlProcessInfo_v1_st {
	unsigned int pid;
	unsigned long long usedGpuMemory;
};

/* nvmlDevice{Compute,Graphics,MPSCompute}RunningProcesses_v2 and _v3 element
 * (nvmlProcessInfo_v2_t; NVML 12.0's header alone gave _v3 a longer one, see
 * nvml_process_hooks.c). */
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} nvmlProcessInfo_t;

/* nvmlDeviceGetProcessUtilization element. */
typedef struct {
	unsigned int pid;
	unsigned long long timeStamp;
	unsigned int smUtil;
	unsigned int memUtil;
	unsigned int encUtil;
	unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

/* nvmlDeviceGetProcessesUtilizationInfo: the request (version 1) and its elements. */
typedef struct {
	unsigned long long timeStamp;
	unsigned int pid;
	unsigned int smUtil;
	unsigned int memUtil;
	unsigned int encUtil;
	unsigned int decUtil;
	unsigned int jpgUtil;
	unsigned int ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;

typedef struct {
	unsigned int version; /* nvmlProcessesUtilizationInfo_v1 */
	unsigned int processSamplesCount; /* in: room in procUtilArray; out: samples (or needed) */
	unsigned long long lastSeenTimeStamp;
	nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_t;

/* NVML_STRUCT_VERSION(ProcessesUtilizationInfo, 1) */
#define nvmlProcessesUtilizationInfo_v1 ((unsigned int)(sizeof(nvmlProcessesUtilizationInfo_t) | (1u << 24)))

/* nvmlDeviceGetRunningProcessDetailList (driver 535+): one list per mode, the
 * request carrying the room and the array; its element has the confidential-
 * computing bytes that NVML 12.0 had put in the _v3 list's element. */
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
	unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessDetail_v1_t;

typedef struct {
	unsigned int version; /* nvmlProcessDetailList_v1 */
	unsigned int mode;    /* NVML_PROCESS_MODE_* */
	unsigned int numProcArrayEntries; /* in: room in procArray; out: entries (or needed) */
	nvmlProcessDetail_v1_t *procArray;
} nvmlProcessDetailList_t;

#define NVML_PROCESS_MODE_COMPUTE 0u
#define NVML_PROCESS_MODE_GRAPHICS 1u
#define NVML_PROCESS_MODE_MPS 2u

/* NVML_STRUCT_VERSION(ProcessDetailList, 1) */
#define nvmlProcessDetailList_v1 ((unsigned int)(sizeof(nvmlProcessDetailList_t) | (1u << 24)))

#endif
