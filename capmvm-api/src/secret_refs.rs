//! The Secrets a MicrovmCluster names (`spec.tlsSecretRef`, `spec.placement.staticPool.basicAuthSecret`)
//! are names in its own namespace: the operator reads them there and nowhere else. A
//! `namespace/name` would name another namespace's Secret, so the CRDs refuse it at admission with
//! a CEL rule (the API server puts the field's path before the message), at every served version.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, ValidationRule,
};

/// The fields that name a credentials Secret.
pub const SECRET_NAME_FIELDS: &[&str] = &["tlsSecretRef", "basicAuthSecret"];

/// The CEL rule: a name, never `namespace/name`.
pub const RULE: &str = "!self.contains('/')";

/// What the API server answers after the field's path when the rule fails.
pub const MESSAGE: &str = "names a Secret in another namespace: a MicrovmCluster may use only Secrets in its own namespace; create the Secret in the MicrovmCluster's namespace and give its name alone, without a namespace/ prefix";

/// Adds [`RULE`] to every [`SECRET_NAME_FIELDS`] string field of every version of `crd`.
pub(crate) fn refuse_other_namespaces(crd: &mut CustomResourceDefinition) {
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            walk(schema);
        }
    }
}

fn walk(node: &mut JSONSchemaProps) {
    if let Some(properties) = node.properties.as_mut() {
        for (name, child) in properties.iter_mut() {
            if SECRET_NAME_FIELDS.contains(&name.as_str())
                && child.type_.as_deref() == Some("string")
            {
                child
                    .x_kubernetes_validations
                    .get_or_insert_default()
                    .push(ValidationRule {
                        rule: RULE.to_string(),
                        message: Some(MESSAGE.to_string()),
                        ..Default::default()
                    });
            }
            walk(child);
        }
    }
    match node.items.as_mut() {
        Some(JSONSchemaPropsOrArray::Schema(item)) => walk(item),
        Some(JSONSchemaPropsOrArray::Schemas(items)) => items.iter_mut().for_each(walk),
        None => {}
    }
}
