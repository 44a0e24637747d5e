// Anchor translation unit for the shared torch precompiled header (rlhf_torch_pch).
