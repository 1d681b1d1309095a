//! `capmvm-crdgen`: prints every CRD as multi-document YAML, or writes one file per CRD.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;

/// Prints the CustomResourceDefinitions of capmvm.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Write one `<group>_<plural>.yaml` file per CRD into this directory instead of printing.
    #[arg(long)]
    out_dir: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.out_dir {
        None => print!("{}", capmvm_crdgen::render_multi_document()?),
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for crd in capmvm_crdgen::render()? {
                let path = dir.join(&crd.file_name);
                std::fs::write(&path, &crd.yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}
