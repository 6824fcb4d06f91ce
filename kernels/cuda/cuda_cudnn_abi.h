/*
 * cuda_cudnn_abi.h — the part of cuDNN 9's backend (graph) API that
 * cuda_attention_cudnn.c calls, written out: descriptor kinds, attribute names
 * and types, and the functions it looks up with dlsym. ringscan never links
 * cuDNN and builds without its headers; tests/unit/test_attn_cudnn_graph.c
 * compares every value here with cudnn_graph.h wherever that is installed.
 * The values of the graph itself (data types, pointwise modes, reductions)
 * are in kernels/cuda/attention/cudnn_graph.h.
 */
#ifndef RS_CUDA_CUDNN_ABI_H
#define RS_CUDA_CUDNN_ABI_H

#include <stddef.h>
#include <stdint.h>

enum {
    CDA_STATUS_SUCCESS = 0,
    /* descriptor kinds (cudnnBackendDescriptorType_t) */
    CDA_BACKEND_POINTWISE_DESCRIPTOR = 0, CDA_BACKEND_ENGINE_DESCRIPTOR = 2, CDA_BACKEND_ENGINECFG_DESCRIPTOR = 3,
    CDA_BACKEND_ENGINEHEUR_DESCRIPTOR = 4, CDA_BACKEND_EXECUTION_PLAN_DESCRIPTOR = 5,
    CDA_BACKEND_OPERATION_POINTWISE_DESCRIPTOR = 13, CDA_BACKEND_OPERATIONGRAPH_DESCRIPTOR = 15,
    CDA_BACKEND_VARIANT_PACK_DESCRIPTOR = 16, CDA_BACKEND_TENSOR_DESCRIPTOR = 17, CDA_BACKEND_MATMUL_DESCRIPTOR = 18,
    CDA_BACKEND_OPERATION_MATMUL_DESCRIPTOR = 19, CDA_BACKEND_REDUCTION_DESCRIPTOR = 21,
    CDA_BACKEND_OPERATION_REDUCTION_DESCRIPTOR = 22, CDA_BACKEND_OPERATION_RESHAPE_DESCRIPTOR = 31,
    /* attribute value types (cudnnBackendAttributeType_t) */
    CDA_TYPE_HANDLE = 0, CDA_TYPE_DATA_TYPE = 1, CDA_TYPE_BOOLEAN = 2, CDA_TYPE_INT64 = 3, CDA_TYPE_FLOAT = 4,
    CDA_TYPE_VOID_PTR = 6, CDA_TYPE_HEUR_MODE = 8, CDA_TYPE_NUMERICAL_NOTE = 11, CDA_TYPE_POINTWISE_MODE = 14,
    CDA_TYPE_BACKEND_DESCRIPTOR = 15, CDA_TYPE_REDUCTION_OPERATOR_TYPE = 18,
    /* attribute names (cudnnBackendAttributeName_t) */
    CDA_ATTR_POINTWISE_MODE = 0, CDA_ATTR_POINTWISE_MATH_PREC = 1, CDA_ATTR_POINTWISE_AXIS = 9,
    CDA_ATTR_ENGINEHEUR_MODE = 200, CDA_ATTR_ENGINEHEUR_OPERATION_GRAPH = 201, CDA_ATTR_ENGINEHEUR_RESULTS = 202,
    CDA_ATTR_ENGINECFG_ENGINE = 300, CDA_ATTR_EXECUTION_PLAN_HANDLE = 400, CDA_ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 401,
    CDA_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE = 402, CDA_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR = 750,
    CDA_ATTR_OPERATION_POINTWISE_XDESC = 751, CDA_ATTR_OPERATION_POINTWISE_BDESC = 752,
    CDA_ATTR_OPERATION_POINTWISE_YDESC = 753, CDA_ATTR_OPERATION_POINTWISE_TDESC = 758,
    CDA_ATTR_OPERATIONGRAPH_HANDLE = 800, CDA_ATTR_OPERATIONGRAPH_OPS = 801, CDA_ATTR_TENSOR_BYTE_ALIGNMENT = 900,
    CDA_ATTR_TENSOR_DATA_TYPE = 901, CDA_ATTR_TENSOR_DIMENSIONS = 902, CDA_ATTR_TENSOR_STRIDES = 903,
    CDA_ATTR_TENSOR_UNIQUE_ID = 906, CDA_ATTR_TENSOR_IS_VIRTUAL = 907, CDA_ATTR_TENSOR_IS_BY_VALUE = 908,
    CDA_ATTR_TENSOR_RAGGED_OFFSET_DESC = 913,
    CDA_ATTR_VARIANT_PACK_UNIQUE_IDS = 1000, CDA_ATTR_VARIANT_PACK_DATA_POINTERS = 1001,
    CDA_ATTR_VARIANT_PACK_WORKSPACE = 1003, CDA_ATTR_ENGINE_NUMERICAL_NOTE = 1303, CDA_ATTR_MATMUL_COMP_TYPE = 1500,
    CDA_ATTR_OPERATION_MATMUL_ADESC = 1520, CDA_ATTR_OPERATION_MATMUL_BDESC = 1521,
    CDA_ATTR_OPERATION_MATMUL_CDESC = 1522, CDA_ATTR_OPERATION_MATMUL_DESC = 1523,
    CDA_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC = 1525, CDA_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC = 1526,
    CDA_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC = 1527, CDA_ATTR_REDUCTION_OPERATOR = 1600,
    CDA_ATTR_REDUCTION_COMP_TYPE = 1601, CDA_ATTR_OPERATION_REDUCTION_XDESC = 1610,
    CDA_ATTR_OPERATION_REDUCTION_YDESC = 1611, CDA_ATTR_OPERATION_REDUCTION_DESC = 1612,
    CDA_ATTR_OPERATION_RESHAPE_XDESC = 2200, CDA_ATTR_OPERATION_RESHAPE_YDESC = 2201,
    /* heuristics modes, numerical notes */
    CDA_HEUR_MODE_FALLBACK = 2, CDA_HEUR_MODE_A = 3, CDA_NUMERICAL_NOTE_NONDETERMINISTIC = 4,
};

/* the functions looked up in libcudnn.so.9 (handles and descriptors are opaque pointers) */
typedef struct {
    size_t (*GetVersion)(void);
    const char *(*GetErrorString)(int status);
    void (*GetLastErrorString)(char *message, size_t max_size);
    int (*Create)(void **handle);
    int (*SetStream)(void *handle, void *stream);
    int (*BackendCreateDescriptor)(int type, void **desc);
    int (*BackendDestroyDescriptor)(void *desc);
    int (*BackendFinalize)(void *desc);
    int (*BackendSetAttribute)(void *desc, int name, int type, int64_t count, const void *elements);
    int (*BackendGetAttribute)(void *desc, int name, int type, int64_t requested, int64_t *count, void *elements);
    int (*BackendExecute)(void *handle, void *plan, void *variant_pack);
} CudnnApi;

#endif
