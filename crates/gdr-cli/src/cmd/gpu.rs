//! Opening the GPU and its BAR-mapping backend for a subcommand.

use gdr::bar::VulkanBackend;
use gdr::cuda::Context;

/// `--gpu N`, shared by the subcommands that use a GPU.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct GpuArg {
    /// CUDA device ordinal to use
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
}

/// The CUDA context and Vulkan BAR backend on `--gpu`.
pub fn open(arg: GpuArg) -> Result<VulkanBackend, Box<dyn std::error::Error + Send + Sync>> {
    let ctx = Context::on(arg.gpu)?;
    Ok(VulkanBackend::new(&ctx)?)
}
