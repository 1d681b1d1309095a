//! The functions a CRD rule may call on the real server, with their overloads: CEL's standard library
//! and the libraries kube-apiserver v1.36 adds (strings v2, lists v3 and Kubernetes' lists, regex,
//! sets, optionals, URLs, IPs and CIDRs, quantities, semver, named formats). The type checker resolves
//! calls against these; evaluation is the `cel` crate's (see the module's docs for what it lacks).

use std::collections::HashMap;
use std::sync::LazyLock;

use super::types::Ty;

/// One overload: whether it is called on a receiver (the receiver is `args[0]`), its argument types
/// and result, in which `A`, `B`, `K` and `V` are type parameters.
#[derive(Debug)]
pub(crate) struct Overload {
    pub(crate) member: bool,
    pub(crate) args: Vec<Ty>,
    pub(crate) result: Ty,
}

impl Overload {
    /// Whether the overload has type parameters (instantiated afresh at each call).
    pub(crate) fn is_generic(&self) -> bool {
        fn generic(t: &Ty) -> bool {
            match t {
                Ty::Param(_) => true,
                Ty::List(e) => generic(e),
                Ty::Map(k, v) => generic(k) || generic(v),
                Ty::Type(Some(t)) => generic(t),
                Ty::Opaque(_, p) => p.iter().any(generic),
                _ => false,
            }
        }
        self.args.iter().any(generic) || generic(&self.result)
    }
}

/// The declared functions by name.
pub(crate) fn lookup(name: &str) -> Option<&'static [Overload]> {
    FUNCTIONS.get(name).map(Vec::as_slice)
}

/// The identifiers that name types (`type(self) == string`).
pub(crate) fn type_ident(name: &str) -> Option<Ty> {
    let t = match name {
        "bool" => Ty::Bool,
        "bytes" => Ty::Bytes,
        "double" => Ty::Double,
        "dyn" => Ty::Dyn,
        "int" => Ty::Int,
        "list" => Ty::list(Ty::Dyn),
        "map" => Ty::map(Ty::Dyn, Ty::Dyn),
        "null_type" => Ty::Null,
        "string" => Ty::String,
        "type" => Ty::Type(None),
        "uint" => Ty::Uint,
        _ => return None,
    };
    Some(Ty::Type(Some(Box::new(t))))
}

const URL: Ty = Ty::Opaque("kubernetes.URL", Vec::new());
const QUANTITY: Ty = Ty::Opaque("kubernetes.Quantity", Vec::new());
const IP: Ty = Ty::Opaque("net.IP", Vec::new());
const CIDR: Ty = Ty::Opaque("net.CIDR", Vec::new());
const SEMVER: Ty = Ty::Opaque("kubernetes.Semver", Vec::new());
const FORMAT: Ty = Ty::Opaque("kubernetes.NamedFormat", Vec::new());

static FUNCTIONS: LazyLock<HashMap<&'static str, Vec<Overload>>> = LazyLock::new(|| {
    let mut d = Decls::default();
    let (a, b, k, v) = (
        Ty::param("A"),
        Ty::param("B"),
        Ty::param("K"),
        Ty::param("V"),
    );
    let la = || Ty::list(Ty::param("A"));
    let mkv = || Ty::map(Ty::param("K"), Ty::param("V"));
    use Ty::{Bool, Bytes, Double, Duration, Int, String as Str, Timestamp, Uint};

    // Operators.
    d.global("!_", [Bool], Bool);
    d.global("-_", [Int], Int);
    d.global("-_", [Double], Double);
    d.global("_?_:_", [Bool, a.clone(), a.clone()], a.clone());
    for op in ["_==_", "_!=_"] {
        d.global(op, [a.clone(), a.clone()], Bool);
    }
    for op in ["_&&_", "_||_"] {
        d.global(op, [Bool, Bool], Bool);
    }
    d.global("@not_strictly_false", [Bool], Bool);
    let numbers = [Int, Uint, Double];
    for op in ["_<_", "_<=_", "_>_", "_>=_"] {
        // Cross-type numeric comparisons are on since 1.28.
        for x in &numbers {
            for y in &numbers {
                d.global(op, [x.clone(), y.clone()], Bool);
            }
        }
        for t in [Bool, Str, Bytes, Timestamp, Duration] {
            d.global(op, [t.clone(), t], Bool);
        }
    }
    for t in [Int, Uint, Double, Str, Bytes] {
        d.global("_+_", [t.clone(), t.clone()], t);
    }
    d.global("_+_", [la(), la()], la());
    d.global("_+_", [Timestamp, Duration], Timestamp);
    d.global("_+_", [Duration, Timestamp], Timestamp);
    d.global("_+_", [Duration, Duration], Duration);
    for t in &numbers {
        for op in ["_-_", "_*_", "_/_"] {
            d.global(op, [t.clone(), t.clone()], t.clone());
        }
    }
    d.global("_-_", [Timestamp, Timestamp], Duration);
    d.global("_-_", [Timestamp, Duration], Timestamp);
    d.global("_-_", [Duration, Duration], Duration);
    d.global("_%_", [Int, Int], Int);
    d.global("_%_", [Uint, Uint], Uint);
    d.global("_[_]", [la(), Int], a.clone());
    d.global("_[_]", [mkv(), k.clone()], v.clone());
    d.global("_[?_]", [la(), Int], Ty::optional(a.clone()));
    d.global("_[?_]", [mkv(), k.clone()], Ty::optional(v.clone()));
    d.global("@in", [a.clone(), la()], Bool);
    d.global("@in", [a.clone(), Ty::map(a.clone(), b.clone())], Bool);

    // Standard functions.
    for t in [Str, Bytes, la(), mkv()] {
        d.global("size", [t.clone()], Int);
        d.member("size", [t], Int);
    }
    for f in ["contains", "startsWith", "endsWith", "matches"] {
        d.member(f, [Str, Str], Bool);
    }
    d.global("matches", [Str, Str], Bool);
    for t in [Int, Uint, Double, Str, Timestamp] {
        d.global("int", [t], Int);
    }
    for t in [Uint, Int, Double, Str] {
        d.global("uint", [t], Uint);
    }
    for t in [Double, Int, Uint, Str] {
        d.global("double", [t], Double);
    }
    for t in [
        Str, Int, Uint, Double, Bool, Bytes, Timestamp, Duration, IP, CIDR,
    ] {
        d.global("string", [t], Str);
    }
    d.global("bytes", [Bytes], Bytes);
    d.global("bytes", [Str], Bytes);
    d.global("bool", [Bool], Bool);
    d.global("bool", [Str], Bool);
    d.global("dyn", [a.clone()], Ty::Dyn);
    d.global("type", [a.clone()], Ty::Type(Some(Box::new(a.clone()))));
    d.global("duration", [Duration], Duration);
    d.global("duration", [Str], Duration);
    for t in [Timestamp, Str, Int] {
        d.global("timestamp", [t], Timestamp);
    }
    for f in [
        "getFullYear",
        "getMonth",
        "getDayOfYear",
        "getDayOfMonth",
        "getDate",
        "getDayOfWeek",
        "getHours",
        "getMinutes",
        "getSeconds",
        "getMilliseconds",
    ] {
        d.member(f, [Timestamp], Int);
        d.member(f, [Timestamp, Str], Int);
    }
    for f in ["getHours", "getMinutes", "getSeconds", "getMilliseconds"] {
        d.member(f, [Duration], Int);
    }

    // Optionals.
    d.global("optional.of", [a.clone()], Ty::optional(a.clone()));
    d.global(
        "optional.ofNonZeroValue",
        [a.clone()],
        Ty::optional(a.clone()),
    );
    d.global("optional.none", [], Ty::optional(a.clone()));
    d.member("hasValue", [Ty::optional(a.clone())], Bool);
    d.member("value", [Ty::optional(a.clone())], a.clone());
    d.member("orValue", [Ty::optional(a.clone()), a.clone()], a.clone());
    d.member(
        "or",
        [Ty::optional(a.clone()), Ty::optional(a.clone())],
        Ty::optional(a.clone()),
    );

    // Strings (cel-go's ext.Strings, version 2).
    d.member("charAt", [Str, Int], Str);
    for f in ["indexOf", "lastIndexOf"] {
        d.member(f, [Str, Str], Int);
        d.member(f, [Str, Str, Int], Int);
    }
    for f in ["lowerAscii", "upperAscii", "trim"] {
        d.member(f, [Str], Str);
    }
    d.member("replace", [Str, Str, Str], Str);
    d.member("replace", [Str, Str, Str, Int], Str);
    d.member("split", [Str, Str], Ty::list(Str));
    d.member("split", [Str, Str, Int], Ty::list(Str));
    d.member("substring", [Str, Int], Str);
    d.member("substring", [Str, Int, Int], Str);
    d.member("join", [Ty::list(Str)], Str);
    d.member("join", [Ty::list(Str), Str], Str);
    d.member("format", [Str, Ty::list(Ty::Dyn)], Str);
    d.global("strings.quote", [Str], Str);

    // Regular expressions (Kubernetes' regex library).
    d.member("find", [Str, Str], Str);
    d.member("findAll", [Str, Str], Ty::list(Str));
    d.member("findAll", [Str, Str, Int], Ty::list(Str));

    // Lists: Kubernetes' library and cel-go's ext.Lists (version 3).
    for t in [Int, Uint, Double, Bool, Str, Bytes, Duration, Timestamp] {
        d.member("isSorted", [Ty::list(t.clone())], Bool);
        d.member("min", [Ty::list(t.clone())], t.clone());
        d.member("max", [Ty::list(t.clone())], t);
    }
    for t in [Int, Uint, Double, Duration] {
        d.member("sum", [Ty::list(t.clone())], t);
    }
    for f in ["indexOf", "lastIndexOf"] {
        d.member(f, [la(), a.clone()], Int);
    }
    d.member("slice", [la(), Int, Int], la());
    d.member("flatten", [Ty::list(la())], la());
    d.member("flatten", [Ty::list(Ty::Dyn), Int], Ty::list(Ty::Dyn));
    for f in ["distinct", "reverse", "sort"] {
        d.member(f, [la()], la());
    }
    for f in ["first", "last"] {
        d.member(f, [la()], Ty::optional(a.clone()));
    }
    d.global("lists.range", [Int], Ty::list(Int));
    for f in ["sets.contains", "sets.equivalent", "sets.intersects"] {
        d.global(f, [la(), la()], Bool);
    }

    // URLs, IPs and CIDRs, quantities, semantic versions, named formats.
    d.global("url", [Str], URL);
    d.global("isURL", [Str], Bool);
    for f in [
        "getScheme",
        "getHost",
        "getHostname",
        "getPort",
        "getEscapedPath",
    ] {
        d.member(f, [URL], Str);
    }
    d.member("getQuery", [URL], Ty::map(Str, Ty::list(Str)));
    d.global("ip", [Str], IP);
    d.global("isIP", [Str], Bool);
    d.global("ip.isCanonical", [Str], Bool);
    d.member("family", [IP], Int);
    for f in [
        "isUnspecified",
        "isLoopback",
        "isLinkLocalMulticast",
        "isLinkLocalUnicast",
        "isGlobalUnicast",
    ] {
        d.member(f, [IP], Bool);
    }
    d.global("cidr", [Str], CIDR);
    d.global("isCIDR", [Str], Bool);
    d.member("containsIP", [CIDR, Str], Bool);
    d.member("containsIP", [CIDR, IP], Bool);
    d.member("containsCIDR", [CIDR, Str], Bool);
    d.member("containsCIDR", [CIDR, CIDR], Bool);
    d.member("ip", [CIDR], IP);
    d.member("masked", [CIDR], CIDR);
    d.member("prefixLength", [CIDR], Int);
    d.global("quantity", [Str], QUANTITY);
    d.global("isQuantity", [Str], Bool);
    d.member("isInteger", [QUANTITY], Bool);
    d.member("asInteger", [QUANTITY], Int);
    d.member("asApproximateFloat", [QUANTITY], Double);
    d.member("sign", [QUANTITY], Int);
    for f in ["add", "sub"] {
        d.member(f, [QUANTITY, QUANTITY], QUANTITY);
        d.member(f, [QUANTITY, Int], QUANTITY);
    }
    for f in ["isGreaterThan", "isLessThan"] {
        d.member(f, [QUANTITY, QUANTITY], Bool);
        d.member(f, [SEMVER, SEMVER], Bool);
    }
    d.member("compareTo", [QUANTITY, QUANTITY], Int);
    d.member("compareTo", [SEMVER, SEMVER], Int);
    d.global("semver", [Str], SEMVER);
    d.global("semver", [Str, Bool], SEMVER);
    d.global("isSemver", [Str], Bool);
    d.global("isSemver", [Str, Bool], Bool);
    for f in ["major", "minor", "patch"] {
        d.member(f, [SEMVER], Int);
    }
    d.global("format.named", [Str], Ty::optional(FORMAT));
    for f in [
        "format.dns1123Label",
        "format.dns1123Subdomain",
        "format.dns1035Label",
        "format.qualifiedName",
        "format.dns1123LabelPrefix",
        "format.dns1123SubdomainPrefix",
        "format.dns1035LabelPrefix",
        "format.labelValue",
        "format.uri",
        "format.uuid",
        "format.byte",
        "format.date",
        "format.datetime",
    ] {
        d.global(f, [], FORMAT);
    }
    d.member("validate", [FORMAT, Str], Ty::optional(Ty::list(Str)));
    d.0
});

#[derive(Default)]
struct Decls(HashMap<&'static str, Vec<Overload>>);

impl Decls {
    fn global<const N: usize>(&mut self, name: &'static str, args: [Ty; N], result: Ty) {
        self.add(name, false, args.into(), result);
    }

    fn member<const N: usize>(&mut self, name: &'static str, args: [Ty; N], result: Ty) {
        self.add(name, true, args.into(), result);
    }

    fn add(&mut self, name: &'static str, member: bool, args: Vec<Ty>, result: Ty) {
        self.0.entry(name).or_default().push(Overload {
            member,
            args,
            result,
        });
    }
}
