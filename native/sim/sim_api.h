/*
 * Driver API and NVML declarations the simulated GPU needs beyond
 * include/hami/cuda_types.h. Layouts follow the public ABI of libcuda.so.1
 * (CUDA 12/13) and libnvidia-ml.so.1; only what the sim reads or writes.
 */
#ifndef HAMI_SIM_API_H
#define HAMI_SIM_API_H

#include "hami/cuda_types.h"

/* ---- CUDA driver API ---------------------------------------------------- */

/* Special stream handles. */
#define SIM_STREAM_LEGACY ((CUstream)0x1)
#define SIM_STREAM_PER_THREAD ((CUstream)0x2)

typedef struct CUlaunchAttribute_st CUlaunchAttribute; /* never read */
typedef struct CUevent_st *CUevent;
typedef struct CUgraphEdgeData_st CUgraphEdgeData; /* never read or written */

/* Results cuda_types.h does not name (the real CUresult values). SIM_ names:
 * the shared header may come to declare the plain ones. */
enum {
	SIM_CUDA_ERROR_ILLEGAL_STATE = 401,
	SIM_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
	SIM_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
	SIM_CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908
};

/* cuEventCreate flags (CUevent_flags) and cuEventRecordWithFlags flags. */
enum {
	SIM_CU_EVENT_BLOCKING_SYNC = 0x1,
	SIM_CU_EVENT_DISABLE_TIMING = 0x2,
	SIM_CU_EVENT_INTERPROCESS = 0x4,
	SIM_CU_EVENT_RECORD_EXTERNAL = 0x1
};

/* CUstreamCaptureMode (a capture's, and a thread's interaction mode) and
 * CUstreamCaptureStatus. */
enum {
	SIM_CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
	SIM_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
	SIM_CU_STREAM_CAPTURE_MODE_RELAXED = 2
};
enum {
	SIM_CU_STREAM_CAPTURE_STATUS_NONE = 0,
	SIM_CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
	SIM_CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
};

/* CUgraphInstantiate_flags: AUTO_FREE_ON_LAUNCH 1, UPLOAD 2, DEVICE_LAUNCH 4,
 * USE_NODE_PRIORITY 8. */
#define SIM_CUDA_GRAPH_INSTANTIATE_FLAGS 0xfull
#define SIM_CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH 0x1ull

typedef struct {
	unsigned int gridDimX;
	unsigned int gridDimY;
	unsigned int gridDimZ;
	unsigned int blockDimX;
	unsigned int blockDimY;
	unsigned int blockDimZ;
	unsigned int sharedMemBytes;
	CUstream hStream;
	CUlaunchAttribute *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;



/* cuArray3DCreate flags the sim looks at. */
enum { CUDA_ARRAY3D_LAYERED = 0x01, CUDA_ARRAY3D_CUBEMAP = 0x04 };

/* Device attributes with non-zero answers (see dev_attribute in sim_cuda.c). */
enum {
	CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2,
	CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y = 3,
	CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z = 4,
	CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
	CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6,
	CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z = 7,
	CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
	CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
	CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
	CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95,
	CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
	CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115
};

/* ---- sim-only knobs (libcuda.so.1) ------------------------------------- */

/* Not driver API: the "hamiSim" prefix keeps them clear of every cu* name.
 * Both need cuInit first and answer a CUresult. */

/* Set this process's driver-internal bytes on CUDA device DEVICE to exactly
 * BYTES (0 gives them back): memory its driver holds that no allocation call
 * returned. CUDA_ERROR_OUT_OF_MEMORY (and nothing changes) when the device
 * has no room for the growth. */
int hamiSimDriverInternal(int device, unsigned long long bytes);
/* GRAPHICS nonzero: NVML lists this process among the graphics processes
 * (nvmlDeviceGetGraphicsRunningProcesses*) instead of the compute ones. */
int hamiSimGraphicsProcess(int graphics);
/* *COUNT: the events this process holds (created, not destroyed, their
 * context alive). */
int hamiSimEvents(unsigned long long *count);
/* The Nth next call of CALL in this process fails with CUDA_ERROR_UNKNOWN and
 * does nothing (a failure injected half-way through a park); N 0: none. */
int hamiSimFail(const char *call, unsigned n);

/* ---- NVML ----------------------------------------------------------------- */

enum {
	NVML_ERROR_ALREADY_INITIALIZED = 5,
	NVML_ERROR_DRIVER_NOT_LOADED = 9,
	NVML_ERROR_OPERATING_SYSTEM = 17,
	NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
};

#define SIM_NVML_VALUE_NOT_AVAILABLE 0xffffffffu

/* nvmlDeviceGetComputeRunningProcesses (v1) element. */
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16

/* nvmlPciInfo_t as nvmlDeviceGetPciInfo_v2/_v3 fill it. */
typedef struct {
	char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
	unsigned int domain;
	unsigned int bus;
	unsigned int device;
	unsigned int pciDeviceId;
	unsigned int pciSubSystemId;
	char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

#endif
