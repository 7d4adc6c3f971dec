use anyhow::Result;
#[derive(clap::Subcommand)]
pub enum Which {
    Overhead,
}
pub fn run(_w: Which) -> Result<()> {
    Ok(())
}
