// The exported NCCL tuner table (ncclTunerPlugin_v5). NCCL 2.28 finds it in the net plugin's
// library when NCCL_TUNER_PLUGIN is unset; the code behind it is tuner.h/tuner.cc.
#include "plugins/nccl/tuner.h"

extern "C" {

__attribute__((visibility("default"))) ncclTuner_v5_t ncclTunerPlugin_v5 = {
    .name = "Strait",
    .init = strait::nccl::tuner::Init,
    .getCollInfo = strait::nccl::tuner::GetCollInfo,
    .finalize = strait::nccl::tuner::Finalize,
};

}  // extern "C"
