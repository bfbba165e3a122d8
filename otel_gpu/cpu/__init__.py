# SPDX-License-Identifier: Apache-2.0
"""CPU profiling: the eBPF sampler (:mod:`.sampler`) and the profile source the agent drains (:mod:`.source`)."""
