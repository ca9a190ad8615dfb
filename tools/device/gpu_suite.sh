#!/bin/bash
# The whole GPU suite under MPS, on the working tree copied to the device.
export PYTHONPATH=. HMC_MILC_FIXTURES=${HMC_MILC_FIXTURES:-$PWD/.device/fixtures} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout ${SUITE_T:-420} python3 -m comms.cuda.mps run -- python3 -m pytest -q -p no:cacheprovider -m gpu ${SUITE_ARGS:-} 2>&1 | tail -${SUITE_TAIL:-25}
echo "suite rc=${PIPESTATUS[0]}"
