//! CEL validation rules as the real server type-checks them at CRD creation and runs them on objects:
//! a rule naming an undeclared field or mixing types is refused with the CRD (422, the checker's
//! message and position), and a rule that cannot be evaluated is an error on the object, never skipped.

use super::*;

const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

/// A CRD `{plural}.test.example.com` whose `spec` has `properties` and the rules `rules`.
fn crd_with(plural: &str, kind: &str, properties: Value, rules: Value) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.test.example.com")},
        "spec": {"group": "test.example.com", "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {
                    "type": "object",
                    "x-kubernetes-validations": rules,
                    "properties": properties}}}}}]}
    })
}

fn sizes() -> Value {
    json!({
        "min": {"type": "integer"}, "max": {"type": "integer"},
        "name": {"type": "string", "maxLength": 20},
        "ratio": {"type": "number"},
        "foo-bar": {"type": "string", "maxLength": 20},
        "args": {"type": "array", "maxItems": 5, "items": {"type": "object",
            "properties": {"name": {"type": "string", "maxLength": 20}}}}
    })
}

/// The causes of a 422 as `field: message`, sorted (the real server walks properties in map order),
/// with the per-CRD type name of `self` (`selfType<nanoseconds>`) made stable.
fn causes(r: &Raw) -> Vec<String> {
    let stable = regex::Regex::new(r"selfType\d+").unwrap();
    let mut out: Vec<String> = r.body["details"]["causes"]
        .as_array()
        .unwrap_or_else(|| panic!("no causes: {}", r.text))
        .iter()
        .map(|c| {
            let line = format!(
                "{}: {}",
                c["field"].as_str().unwrap_or(""),
                c["message"].as_str().unwrap_or("")
            );
            stable.replace_all(&line, "selfType").into_owned()
        })
        .collect();
    out.sort();
    out
}

/// `{"Rule":...}` as the real server shows a rule in a CRD error.
fn shown(rule: &str, message: &str, message_expression: &str) -> String {
    format!(
        "{{\"Rule\":{},\"Message\":{},\"MessageExpression\":{},\"Reason\":null,\"FieldPath\":\"\",\"OptionalOldSelf\":null}}",
        json!(rule),
        json!(message),
        json!(message_expression)
    )
    // Go's JSON escapes these.
    .replace('<', "\\u003c")
    .replace('>', "\\u003e")
    .replace('&', "\\u0026")
}

const AT: &str = "spec.validation.openAPIV3Schema.properties[spec]";

async fn a_rule_naming_an_undeclared_field_is_refused_with_the_crd(server: Server) {
    let client = server.client();
    let crd = crd_with(
        "sizes",
        "Size",
        sizes(),
        json!([{"rule": "self.replicas > 0"}]),
    );
    let r = raw(
        &client,
        "POST",
        CRDS,
        Some("application/json"),
        crd.to_string().as_bytes(),
    )
    .await;
    assert_status(&r, 422, "Invalid");
    let expected = format!(
        "{AT}.x-kubernetes-validations[0].rule: Invalid value: {}: compilation failed: ERROR: <input>:1:5: undefined field 'replicas'\n | self.replicas > 0\n | ....^",
        shown("self.replicas > 0", "", "")
    );
    assert_eq!(causes(&r), std::slice::from_ref(&expected));
    assert_eq!(
        r.body["message"],
        format!(
            "CustomResourceDefinition.apiextensions.k8s.io \"sizes.test.example.com\" is invalid: {expected}"
        )
    );
    // Nothing was created.
    let r = raw(
        &client,
        "GET",
        &format!("{CRDS}/sizes.test.example.com"),
        None,
        b"",
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text);
}

async fn rules_with_mismatched_types_are_refused_with_the_crd(server: Server) {
    let client = server.client();
    let rules = json!([
        {"rule": "self.min == 'a'"},
        {"rule": "self.min"},
        {"rule": "self.name.startsWith(1)"},
        {"rule": "size(self.min) > 0"},
        {"rule": "[1, 'a'].size() == 2"},
        {"rule": "self.all(x, x == 'min')"},
        {"rule": "self.ratio + self.min > 1.0"},
        {"rule": "self.min > 0", "messageExpression": "self.min"},
        {"rule": "nope(self.name)"},
        {"rule": "self.min > 0", "optionalOldSelf": true}
    ]);
    // A transition rule where old items cannot be paired with new ones (a list that is not a map).
    let mut properties = sizes();
    properties["args"]["items"]["x-kubernetes-validations"] =
        json!([{"rule": "self == oldSelf", "message": "items are immutable"}]);
    let crd = crd_with("mixes", "Mix", properties, rules);
    let r = raw(
        &client,
        "POST",
        CRDS,
        Some("application/json"),
        crd.to_string().as_bytes(),
    )
    .await;
    assert_status(&r, 422, "Invalid");
    let at = |i: usize, field: &str| format!("{AT}.x-kubernetes-validations[{i}].{field}");
    let failed = |i: usize, rule: &str, detail: &str| {
        format!(
            "{}: Invalid value: {}: {detail}",
            at(i, "rule"),
            shown(rule, "", "")
        )
    };
    let mut expected = vec![
        failed(
            0,
            "self.min == 'a'",
            "compilation failed: ERROR: <input>:1:10: found no matching overload for '_==_' applied to '(int, string)'\n | self.min == 'a'\n | .........^",
        ),
        failed(1, "self.min", "cel expression must evaluate to a bool"),
        failed(
            2,
            "self.name.startsWith(1)",
            "compilation failed: ERROR: <input>:1:21: found no matching overload for 'startsWith' applied to 'string.(int)'\n | self.name.startsWith(1)\n | ....................^",
        ),
        failed(
            3,
            "size(self.min) > 0",
            "compilation failed: ERROR: <input>:1:5: found no matching overload for 'size' applied to '(int)'\n | size(self.min) > 0\n | ....^",
        ),
        failed(
            4,
            "[1, 'a'].size() == 2",
            "compilation failed: ERROR: <input>:1:5: expected type 'int' but found 'string'\n | [1, 'a'].size() == 2\n | ....^",
        ),
        failed(
            5,
            "self.all(x, x == 'min')",
            "compilation failed: ERROR: <input>:1:1: expression of type 'selfType' cannot be range of a comprehension (must be list, map, or dynamic)\n | self.all(x, x == 'min')\n | ^",
        ),
        failed(
            6,
            "self.ratio + self.min > 1.0",
            "compilation failed: ERROR: <input>:1:12: found no matching overload for '_+_' applied to '(double, int)'\n | self.ratio + self.min > 1.0\n | ...........^",
        ),
        format!(
            "{}: Invalid value: {}: messageExpression must evaluate to a string",
            at(7, "messageExpression"),
            shown("self.min > 0", "", "self.min")
        ),
        failed(
            8,
            "nope(self.name)",
            "compilation failed: ERROR: <input>:1:5: undeclared reference to 'nope' (in container '')\n | nope(self.name)\n | ....^",
        ),
        format!(
            "{}: Invalid value: true: may not be set if oldSelf is not used in rule",
            at(9, "optionalOldSelf")
        ),
        format!(
            "{AT}.properties[args].items.x-kubernetes-validations[0].rule: Invalid value: \"self == oldSelf\": oldSelf cannot be used on the uncorrelatable portion of the schema within {AT}.properties[args]"
        ),
    ];
    expected.sort();
    assert_eq!(causes(&r), expected, "{}", r.text);
}

async fn rules_see_declared_types_escaped_names_and_the_object_name(server: Server) {
    let client = server.client();
    let mut crd = crd_with(
        "names",
        "Name",
        sizes(),
        json!([
            {"rule": "!has(self.ratio) || self.ratio == 1.0", "message": "ratio must be 1"},
            {"rule": "!has(self.foo__dash__bar) || self.foo__dash__bar.startsWith('ok')", "message": "foo-bar must start with ok"}
        ]),
    );
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"] = json!([{"rule": "self.metadata.name.startsWith('n-') && self.kind == 'Name'", "message": "names start with n-"}]);
    create_crd(&client, &crd).await;
    let path = "/apis/test.example.com/v1/namespaces/default/names";
    let post = |name: &str, spec: Value| {
        json!({"apiVersion": "test.example.com/v1", "kind": "Name", "metadata": {"name": name}, "spec": spec})
            .to_string()
    };
    // `ratio` is a number: 1 is 1.0 to rules.
    let r = raw(
        &client,
        "POST",
        path,
        Some("application/json"),
        post("n-1", json!({"ratio": 1, "foo-bar": "okay"})).as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = raw(
        &client,
        "POST",
        path,
        Some("application/json"),
        post("x-1", json!({"ratio": 2, "foo-bar": "no"})).as_bytes(),
    )
    .await;
    assert_status(&r, 422, "Invalid");
    assert_eq!(
        causes(&r),
        [
            "<nil>: Invalid value: names start with n-",
            "spec: Invalid value: foo-bar must start with ok",
            "spec: Invalid value: ratio must be 1",
        ]
    );
}

async fn a_rule_that_cannot_be_evaluated_is_an_error_not_a_skip(server: Server) {
    let client = server.client();
    let crd = crd_with(
        "ranges",
        "Range",
        sizes(),
        json!([{"rule": "self.min <= self.max", "message": "min must not exceed max"}]),
    );
    create_crd(&client, &crd).await;
    let path = "/apis/test.example.com/v1/namespaces/default/ranges";
    let post = |spec: Value| {
        json!({"apiVersion": "test.example.com/v1", "kind": "Range", "metadata": {"name": "r"}, "spec": spec})
            .to_string()
    };
    // `max` is absent: the rule cannot be evaluated, and the answer says why.
    let r = raw(
        &client,
        "POST",
        path,
        Some("application/json"),
        post(json!({"min": 1})).as_bytes(),
    )
    .await;
    assert_status(&r, 422, "Invalid");
    assert_eq!(
        causes(&r),
        [
            "spec: Invalid value: \"object\": no such key: max evaluating rule: min must not exceed max"
        ]
    );
    // A value of the wrong type: rules are not run on it, and the answer says so.
    let r = raw(
        &client,
        "POST",
        path,
        Some("application/json"),
        post(json!({"min": "one", "max": 2})).as_bytes(),
    )
    .await;
    assert_status(&r, 422, "Invalid");
    assert_eq!(
        causes(&r),
        [
            "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
            "spec.min: Invalid value: \"string\": spec.min in body must be of type integer: \"string\"",
        ]
    );
    let r = raw(
        &client,
        "POST",
        path,
        Some("application/json"),
        post(json!({"min": 1, "max": 2})).as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
}

/// More of what the checker refuses: `has()` and `oldSelf` of undeclared fields, `null` for a string,
/// list items' object types, member calls on the wrong type, several errors in one rule, the implicit
/// metadata of the root, an object that keeps unknown fields, a messageExpression that does not check.
async fn more_rules_the_real_server_refuses(server: Server) {
    let client = server.client();
    let mut properties = sizes();
    properties["free"] = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let rules = json!([
        {"rule": "has(self.nope)"},
        {"rule": "oldSelf.nope == 1"},
        {"rule": "self.name == null"},
        {"rule": "self.args[0] == 'x'"},
        {"rule": "self.args.exists(a, a.nope == 'x')"},
        {"rule": "self.min.size() > 0"},
        {"rule": "self.min > 'a' || self.nope"},
        {"rule": "self.free.anything == 'x'"},
        {"rule": "self.min > 0", "messageExpression": "'min is ' + self.nope"},
        {"rule": "self.name.matches('[')"},
        {"rule": "duration('1x') > duration('1s')"},
        {"rule": "timestamp('yesterday') < timestamp('2024-01-01T00:00:00Z')"}
    ]);
    let mut crd = crd_with("mores", "More", properties, rules);
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"] =
        json!([{"rule": "has(self.metadata.labels)"}]);
    let r = raw(
        &client,
        "POST",
        CRDS,
        Some("application/json"),
        crd.to_string().as_bytes(),
    )
    .await;
    assert_status(&r, 422, "Invalid");
    let at = |i: usize| format!("{AT}.x-kubernetes-validations[{i}]");
    let failed = |i: usize, rule: &str, detail: &str| {
        format!(
            "{}.rule: Invalid value: {}: compilation failed: {detail}",
            at(i),
            shown(rule, "", "")
        )
    };
    let mut expected = vec![
        failed(
            0,
            "has(self.nope)",
            "ERROR: <input>:1:4: undefined field 'nope'\n | has(self.nope)\n | ...^",
        ),
        failed(
            1,
            "oldSelf.nope == 1",
            "ERROR: <input>:1:8: undefined field 'nope'\n | oldSelf.nope == 1\n | .......^",
        ),
        failed(
            2,
            "self.name == null",
            "ERROR: <input>:1:11: found no matching overload for '_==_' applied to '(string, null)'\n | self.name == null\n | ..........^",
        ),
        failed(
            3,
            "self.args[0] == 'x'",
            "ERROR: <input>:1:14: found no matching overload for '_==_' applied to '(selfType.args.@idx, string)'\n | self.args[0] == 'x'\n | .............^",
        ),
        failed(
            4,
            "self.args.exists(a, a.nope == 'x')",
            "ERROR: <input>:1:22: undefined field 'nope'\n | self.args.exists(a, a.nope == 'x')\n | .....................^",
        ),
        failed(
            5,
            "self.min.size() > 0",
            "ERROR: <input>:1:14: found no matching overload for 'size' applied to 'int.()'\n | self.min.size() > 0\n | .............^",
        ),
        failed(
            6,
            "self.min > 'a' || self.nope",
            "ERROR: <input>:1:10: found no matching overload for '_>_' applied to '(int, string)'\n | self.min > 'a' || self.nope\n | .........^\nERROR: <input>:1:23: undefined field 'nope'\n | self.min > 'a' || self.nope\n | ......................^",
        ),
        failed(
            7,
            "self.free.anything == 'x'",
            "ERROR: <input>:1:10: undefined field 'anything'\n | self.free.anything == 'x'\n | .........^",
        ),
        format!(
            "{}.messageExpression: Invalid value: {}: messageExpression compilation failed: ERROR: <input>:1:17: undefined field 'nope'\n | 'min is ' + self.nope\n | ................^",
            at(8),
            shown("self.min > 0", "", "'min is ' + self.nope")
        ),
        failed(
            9,
            "self.name.matches('[')",
            "ERROR: <input>:1:19: invalid matches argument\n | self.name.matches('[')\n | ..................^",
        ),
        failed(
            10,
            "duration('1x') > duration('1s')",
            "ERROR: <input>:1:10: invalid duration argument\n | duration('1x') > duration('1s')\n | .........^",
        ),
        failed(
            11,
            "timestamp('yesterday') < timestamp('2024-01-01T00:00:00Z')",
            "ERROR: <input>:1:11: invalid timestamp argument\n | timestamp('yesterday') < timestamp('2024-01-01T00:00:00Z')\n | ..........^",
        ),
        format!(
            "spec.validation.openAPIV3Schema.x-kubernetes-validations[0].rule: Invalid value: {}: compilation failed: ERROR: <input>:1:4: undefined field 'labels'\n | has(self.metadata.labels)\n | ...^",
            shown("has(self.metadata.labels)", "", "")
        ),
    ];
    expected.sort();
    assert_eq!(causes(&r), expected, "{}", r.text);
}

/// Rules the real server accepts, from the libraries it declares (strings, lists, sets, optionals,
/// type names), and an int-or-string compared as an int: checked when evaluated, an error then.
async fn rules_the_real_server_accepts_and_how_they_evaluate(server: Server) {
    let client = server.client();
    let mut properties = sizes();
    properties["port"] = json!({"x-kubernetes-int-or-string": true});
    let rules = json!([
        {"rule": "!has(self.name) || self.name.lowerAscii().split('-').size() <= 2", "message": "at most one dash"},
        {"rule": "!has(self.args) || self.args.all(a, a.name in ['a', 'b', 'c'])", "message": "args are a, b or c"},
        // Type-checked here; not evaluated below (the emulator does not evaluate the sets library).
        {"rule": "!has(self.ratio) || sets.contains([1.0, 2.0], [self.ratio])", "message": "ratio is 1 or 2"},
        {"rule": "self.?name.orValue('x') != '' && type(self.min) == int", "message": "name set"},
        {"rule": "!has(self.port) || self.port > 0", "message": "port must be positive"}
    ]);
    create_crd(&client, &crd_with("accepts", "Accept", properties, rules)).await;
    let path = "/apis/test.example.com/v1/namespaces/default/accepts";
    let post = |name: &str, spec: Value| {
        json!({"apiVersion": "test.example.com/v1", "kind": "Accept", "metadata": {"name": name}, "spec": spec})
            .to_string()
    };
    let r = raw(
        &client,
        "POST",
        path,
        Some("application/json"),
        post(
            "ok",
            json!({"min": 1, "name": "A-b", "args": [{"name": "a"}], "port": 80}),
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = raw(
        &client,
        "POST",
        path,
        Some("application/json"),
        post(
            "bad",
            json!({"min": 1, "name": "a-b-c", "args": [{"name": "d"}], "port": "http"}),
        )
        .as_bytes(),
    )
    .await;
    assert_status(&r, 422, "Invalid");
    assert_eq!(
        causes(&r),
        [
            "spec: Invalid value: \"object\": 'no such overload': call arguments did not match a supported operator, function or macro signature for rule: port must be positive",
            "spec: Invalid value: args are a, b or c",
            "spec: Invalid value: at most one dash",
        ]
    );
}

/// A rule's own fields are checked with the schema, before any rule is compiled.
async fn the_fields_of_a_rule_are_checked_with_the_crd(server: Server) {
    let client = server.client();
    let rules = json!([
        {"rule": "  "},
        {"rule": "self.min > 0", "message": "  "},
        {"rule": "self.min > 0", "message": "two\nlines"},
        {"rule": "self.min >\n0"},
        {"rule": "self.min > 0", "reason": "Bogus"},
        {"rule": "self.min > 0", "fieldPath": ".nope"},
        {"rule": "self.min > 0", "messageExpression": " "},
        {"rule": "self.min > 0", "fieldPath": ".args", "reason": "FieldValueForbidden"}
    ]);
    let crd = crd_with("fields", "Field", sizes(), rules);
    let r = raw(
        &client,
        "POST",
        CRDS,
        Some("application/json"),
        crd.to_string().as_bytes(),
    )
    .await;
    assert_status(&r, 422, "Invalid");
    let at = |i: usize, field: &str| format!("{AT}.x-kubernetes-validations[{i}].{field}");
    let mut expected = vec![
        format!("{}: Required value: rule is not specified", at(0, "rule")),
        format!(
            "{}: Invalid value: \"  \": must be non-empty if specified",
            at(1, "message")
        ),
        format!(
            "{}: Invalid value: \"two\\nlines\": must not contain line breaks",
            at(2, "message")
        ),
        format!(
            "{}: Required value: message must be specified if rule contains line breaks",
            at(3, "message")
        ),
        format!(
            "{}: Unsupported value: \"Bogus\": supported values: \"FieldValueDuplicate\", \"FieldValueForbidden\", \"FieldValueInvalid\", \"FieldValueRequired\"",
            at(4, "reason")
        ),
        format!(
            "{}: Invalid value: \".nope\": must be a valid path",
            at(5, "fieldPath")
        ),
        format!(
            "{}: Required value: messageExpression must be non-empty if specified",
            at(6, "messageExpression")
        ),
    ];
    expected.sort();
    assert_eq!(causes(&r), expected, "{}", r.text);
}

/// Every CRD the project and the simulation install type-checks: ours and CAPI v1.14's.
async fn every_crd_we_and_capi_install_is_accepted(server: Server) {
    let client = server.client();
    for crd in project_crds().into_iter().chain(capi_crds()) {
        let name = crd["metadata"]["name"].as_str().unwrap_or("").to_string();
        let r = raw(
            &client,
            "POST",
            CRDS,
            Some("application/json"),
            crd.to_string().as_bytes(),
        )
        .await;
        assert_eq!(r.status, 201, "{name}: {}", r.text);
    }
}

crate::on_both_servers!(
    a_rule_naming_an_undeclared_field_is_refused_with_the_crd,
    rules_with_mismatched_types_are_refused_with_the_crd,
    rules_see_declared_types_escaped_names_and_the_object_name,
    a_rule_that_cannot_be_evaluated_is_an_error_not_a_skip,
    more_rules_the_real_server_refuses,
    rules_the_real_server_accepts_and_how_they_evaluate,
    the_fields_of_a_rule_are_checked_with_the_crd,
    every_crd_we_and_capi_install_is_accepted,
);
