//! Renders the provider's CRDs as YAML: one document per CRD, in a stable order.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// One rendered CRD: the file name it is committed under and its YAML.
pub struct RenderedCrd {
    /// `<group>_<plural>.yaml`, the kubebuilder convention for `config/crd/bases/`.
    pub file_name: String,
    /// The CRD as a YAML document (no leading `---`).
    pub yaml: String,
}

/// Renders every CRD of the provider.
pub fn render() -> anyhow::Result<Vec<RenderedCrd>> {
    capmvm_api::crds().iter().map(render_one).collect()
}

fn render_one(crd: &CustomResourceDefinition) -> anyhow::Result<RenderedCrd> {
    Ok(RenderedCrd {
        file_name: format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural),
        yaml: serde_saphyr::to_string(crd)?,
    })
}

/// All CRDs as one multi-document YAML stream.
pub fn render_multi_document() -> anyhow::Result<String> {
    let mut out = String::new();
    for crd in render()? {
        out.push_str("---\n");
        out.push_str(&crd.yaml);
        if !crd.yaml.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}
