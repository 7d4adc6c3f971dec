//! How a recording names the values the lower layers own.
//!
//! A recording holds some values that are not the schema's own types: a
//! domain ([`Domain`]), how energy was divided ([`Basis`]), the tracker
//! that measured ([`TrackerKind`]), a CPU's times ([`CpuTimes`]), a GPU
//! found ([`GpuInfo`]). Their recorded form is declared here, not derived
//! on the types where they live: each one has a [`Wire`] form, a name
//! per enum variant or a struct of model's own, and the schema's fields
//! go through it with `#[serde(with = "wire::via")]`. Renaming a variant
//! or a field down there is then a compile error here (the mapping names
//! it), never a changed recording; the name written stays the one below.
//!
//! The unit test `every_recorded_field_is_the_schema_s_own` holds this on
//! the parsed sources of `src/model/` (its subdirectories and inline
//! modules too): a field of a type that derives `Serialize` or
//! `Deserialize` there is a standard type, one of model's structs or
//! enums (or an alias of them), or goes through `wire::via`. What it does
//! not see: a hand-written `impl Serialize`, or a derive under `cfg_attr`
//! or made by a macro; model has none.
//!
//! [`Domain`], [`StaticSource`], [`GpuInfo`] and [`GpuEnergyMethod`] keep
//! their own derives for files their layers own (the host power model,
//! `wattprof sources --json`): a rename there changes those, not a
//! recording.

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::attribution::{Basis, StaticShare};
use crate::process::GroupTotals;
use crate::process::container::Runtime;
use crate::sources::Domain;
use crate::sources::nvml::{GpuEnergyMethod, GpuInfo, GpuProcess, SmBasis};
use crate::sources::registry::ReaderUse;
use crate::sources::static_power::StaticSource;
use crate::tracker::{CpuTimes, ExitTracking, TaskClock, TaskWalk, TrackerKind};

/// A value a recording holds in a form model declares.
pub(crate) trait Wire: Sized {
    /// What is written.
    type Form: Serialize + DeserializeOwned;
    /// The recorded form.
    fn to_wire(&self) -> Self::Form;
    /// From the recorded form; an unknown name is an error.
    fn from_wire(form: Self::Form) -> Result<Self, String>;
}

/// `#[serde(with = "wire::via")]`: a field written in its [`Wire`] form.
pub(crate) mod via {
    use serde::de::Error as _;

    use super::{Deserialize, DeserializeOwned, Deserializer, Serialize, Serializer, Wire};

    /// Writes `value`'s recorded form.
    pub(crate) fn serialize<T: Wire, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        value.to_wire().serialize(s)
    }

    /// Reads a recorded form back.
    pub(crate) fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: Wire,
        T::Form: DeserializeOwned,
        D: Deserializer<'de>,
    {
        T::from_wire(T::Form::deserialize(d)?).map_err(D::Error::custom)
    }
}

impl<T: Wire> Wire for Option<T> {
    type Form = Option<T::Form>;
    fn to_wire(&self) -> Self::Form {
        self.as_ref().map(Wire::to_wire)
    }
    fn from_wire(form: Self::Form) -> Result<Self, String> {
        form.map(T::from_wire).transpose()
    }
}

impl<T: Wire> Wire for Vec<T> {
    type Form = Vec<T::Form>;
    fn to_wire(&self) -> Self::Form {
        self.iter().map(Wire::to_wire).collect()
    }
    fn from_wire(form: Self::Form) -> Result<Self, String> {
        form.into_iter().map(T::from_wire).collect()
    }
}

/// An enum written as one name per variant: the names are the schema's
/// (docs/recording.schema.json pins them), the variants the layer's.
macro_rules! names {
    ($what:literal, $ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl Wire for $ty {
            type Form = Cow<'static, str>;
            fn to_wire(&self) -> Self::Form {
                Cow::Borrowed(match self {
                    $($ty::$variant => $name,)+
                })
            }
            fn from_wire(form: Self::Form) -> Result<Self, String> {
                match &*form {
                    $($name => Ok($ty::$variant),)+
                    other => Err(format!(
                        "unknown {} `{other}`; expected one of: {}",
                        $what,
                        [$($name),+].join(", ")
                    )),
                }
            }
        }

        #[cfg(test)]
        impl tests::Names for $ty {
            const NAMES: &'static [&'static str] = &[$($name),+];
        }
    };
}

names!("domain", Domain {
    Package => "package",
    Core => "core",
    Uncore => "uncore",
    Dram => "dram",
    Psys => "psys",
    Wall => "wall",
    Gpu => "gpu",
});

names!("division basis", Basis {
    CpuTime => "cpu_time",
    BusyTime => "busy_time",
    GpuSm => "gpu_sm",
    MachineLevel => "machine_level",
    Calibrated => "calibrated",
});

names!("static power source", StaticSource {
    HostModel => "host_model",
    Learned => "learned",
    ShippedModel => "shipped_model",
    LowestSeen => "lowest_seen",
});

names!("static power rule", StaticShare {
    Capacity => "capacity",
    Busy => "busy",
    Idle => "idle",
});

names!("SM share basis", SmBasis {
    Sampled => "sampled",
    Carried => "carried",
    Equal => "equal",
    InstanceActivity => "instance_activity",
    InstanceSlices => "instance_slices",
});

names!("GPU energy method", GpuEnergyMethod {
    EnergyCounter => "energy_counter",
    PowerIntegration => "power_integration",
});

names!("tracker", TrackerKind {
    Iter => "iter",
    Switch => "switch",
});

names!("task walk", TaskWalk {
    OpenCoded => "open_coded",
    IterTask => "iter_task",
});

names!("exit tracking", ExitTracking {
    FreeEvent => "free_event",
    FinalSwitch => "final_switch",
    ExitTracepoint => "exit_tracepoint",
});

names!("task clock", TaskClock {
    SumExecRuntime => "sum_exec_runtime",
    SwitchTiming => "switch_timing",
});

names!("container runtime", Runtime {
    Docker => "docker",
    Containerd => "containerd",
    Crio => "crio",
    Podman => "podman",
    Kubernetes => "kubernetes",
    Systemd => "systemd",
});

/// A process on a GPU over an interval (`gpus[].processes[]`).
#[derive(Serialize, Deserialize)]
pub(crate) struct GpuProcessForm {
    pid: u32,
    sm_util_pct: f64,
    memory_bytes: u64,
}

impl Wire for GpuProcess {
    type Form = GpuProcessForm;
    fn to_wire(&self) -> Self::Form {
        GpuProcessForm {
            pid: self.pid,
            sm_util_pct: self.sm_util_pct,
            memory_bytes: self.memory_bytes,
        }
    }
    fn from_wire(f: Self::Form) -> Result<Self, String> {
        Ok(Self {
            pid: f.pid,
            sm_util_pct: f.sm_util_pct,
            memory_bytes: f.memory_bytes,
        })
    }
}

/// A GPU found (`host.gpus[]`).
#[derive(Serialize, Deserialize)]
pub(crate) struct GpuInfoForm {
    index: u32,
    name: String,
    uuid: String,
    #[serde(with = "via")]
    method: GpuEnergyMethod,
    memory_total_bytes: u64,
    mig: bool,
}

impl Wire for GpuInfo {
    type Form = GpuInfoForm;
    fn to_wire(&self) -> Self::Form {
        GpuInfoForm {
            index: self.index,
            name: self.name.clone(),
            uuid: self.uuid.clone(),
            method: self.method,
            memory_total_bytes: self.memory_total_bytes,
            mig: self.mig,
        }
    }
    fn from_wire(f: Self::Form) -> Result<Self, String> {
        Ok(Self {
            index: f.index,
            name: f.name,
            uuid: f.uuid,
            method: f.method,
            memory_total_bytes: f.memory_total_bytes,
            mig: f.mig,
        })
    }
}

/// A reader in use, or why a kind of energy is not measured
/// (`energy.readers[]`, the header's `readers[]`).
#[derive(Serialize, Deserialize)]
pub(crate) struct ReaderForm {
    kind: String,
    name: String,
    detail: String,
    estimated: bool,
    fix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model: Option<String>,
}

impl Wire for ReaderUse {
    type Form = ReaderForm;
    fn to_wire(&self) -> Self::Form {
        ReaderForm {
            kind: self.kind.to_string(),
            name: self.name.to_string(),
            detail: self.detail.clone(),
            estimated: self.estimated,
            fix: self.fix.clone(),
            model: self.model.clone(),
        }
    }
    fn from_wire(f: Self::Form) -> Result<Self, String> {
        Ok(Self {
            kind: Cow::Owned(f.kind),
            name: Cow::Owned(f.name),
            detail: f.detail,
            estimated: f.estimated,
            fix: f.fix,
            model: f.model,
        })
    }
}

/// One CPU's times over the profile (`machine.per_cpu[]`).
#[derive(Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct CpuTimesForm {
    cpu: u32,
    /// `socket` in recordings before schema 4, read as well.
    #[serde(alias = "socket")]
    package: u32,
    busy_ns: u64,
    idle_ns: u64,
    idle_task_ns: u64,
    lost_ns: u64,
    switches: u64,
    window_ns: u64,
}

impl Wire for CpuTimes {
    type Form = CpuTimesForm;
    fn to_wire(&self) -> Self::Form {
        CpuTimesForm {
            cpu: self.cpu,
            package: self.package,
            busy_ns: self.busy_ns,
            idle_ns: self.idle_ns,
            idle_task_ns: self.idle_task_ns,
            lost_ns: self.lost_ns,
            switches: self.switches,
            window_ns: self.window_ns,
        }
    }
    fn from_wire(f: Self::Form) -> Result<Self, String> {
        // The carried and over-capacity times are the tracker's working
        // figures, not recorded.
        Ok(Self {
            cpu: f.cpu,
            package: f.package,
            busy_ns: f.busy_ns,
            idle_ns: f.idle_ns,
            idle_task_ns: f.idle_task_ns,
            lost_ns: f.lost_ns,
            switches: f.switches,
            window_ns: f.window_ns,
            carried_ns: 0,
            over_ns: 0,
        })
    }
}

/// On-CPU time per group over the profile (`groups`).
#[derive(Serialize, Deserialize)]
pub(crate) struct GroupTotalsForm {
    tree_ns: u64,
    profiler_ns: u64,
    other_ns: u64,
}

impl Wire for GroupTotals {
    type Form = GroupTotalsForm;
    fn to_wire(&self) -> Self::Form {
        GroupTotalsForm {
            tree_ns: self.tree_ns,
            profiler_ns: self.profiler_ns,
            other_ns: self.other_ns,
        }
    }
    fn from_wire(f: Self::Form) -> Result<Self, String> {
        Ok(Self {
            tree_ns: f.tree_ns,
            profiler_ns: f.profiler_ns,
            other_ns: f.other_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;

    /// The names an enum is written with, in its variants' order.
    pub(crate) trait Names: Wire<Form = Cow<'static, str>> {
        const NAMES: &'static [&'static str];
    }

    /// Each name reads back as the variant that writes it, and no two
    /// variants share one.
    fn round_trips<T: Names>() -> Vec<&'static str> {
        let distinct: BTreeSet<_> = T::NAMES.iter().collect();
        assert_eq!(distinct.len(), T::NAMES.len(), "a name used twice");
        for name in T::NAMES {
            let v = T::from_wire(Cow::Borrowed(name)).expect("a name it writes");
            assert_eq!(v.to_wire(), *name);
        }
        let e = T::from_wire(Cow::Borrowed("no_such_name")).err();
        assert!(e.is_some_and(|e| e.contains("no_such_name") && e.contains(T::NAMES[0])));
        T::NAMES.to_vec()
    }

    fn schema() -> serde_json::Value {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/recording.schema.json");
        let text = std::fs::read_to_string(&path).expect("docs/recording.schema.json");
        serde_json::from_str(&text).expect("the schema is JSON")
    }

    /// The enum's values at `pointer` in the recording's JSON Schema.
    fn pinned(schema: &serde_json::Value, pointer: &str) -> Vec<String> {
        schema
            .pointer(pointer)
            .and_then(|e| e.as_array())
            .unwrap_or_else(|| panic!("no enum at {pointer}"))
            .iter()
            .map(|v| v.as_str().expect("a name").to_string())
            .collect()
    }

    #[test]
    fn every_name_written_is_the_one_the_schema_pins() {
        let s = schema();
        let defs = |p: &str| format!("/$defs/{p}/enum");
        let cases: [(Vec<&str>, &[&str]); 11] = [
            (
                round_trips::<Domain>(),
                &[
                    "domain_total/properties/domain",
                    "interval_domain/properties/domain",
                    "window_domain/properties/domain",
                ],
            ),
            (
                round_trips::<Basis>(),
                &[
                    "domain_total/properties/basis",
                    "interval_domain/properties/basis",
                ],
            ),
            (
                round_trips::<StaticSource>(),
                &[
                    "domain_total/properties/static_source",
                    "interval_domain/properties/static_source",
                ],
            ),
            (
                round_trips::<StaticShare>(),
                &["recording/properties/energy/properties/static_power/properties/rule"],
            ),
            (
                round_trips::<SmBasis>(),
                &["interval_gpu/properties/sm_basis"],
            ),
            (
                round_trips::<GpuEnergyMethod>(),
                &["gpu_info/properties/method"],
            ),
            (
                round_trips::<TrackerKind>(),
                &["profiler/properties/tracker", "header/properties/tracker"],
            ),
            (
                round_trips::<TaskWalk>(),
                &["profiler/properties/task_walk/anyOf/0"],
            ),
            (
                round_trips::<ExitTracking>(),
                &["profiler/properties/exit_tracking"],
            ),
            (
                round_trips::<TaskClock>(),
                &["profiler/properties/task_clock"],
            ),
            (round_trips::<Runtime>(), &["container/properties/runtime"]),
        ];
        for (names, places) in cases {
            for place in places {
                assert_eq!(pinned(&s, &defs(place)), names, "{place}");
            }
        }
    }

    #[test]
    fn a_struct_s_form_round_trips_and_old_names_still_read() {
        let cpu = CpuTimes {
            cpu: 3,
            package: 1,
            busy_ns: 5,
            idle_ns: 4,
            idle_task_ns: 4,
            lost_ns: 1,
            switches: 9,
            window_ns: 10,
            carried_ns: 7,
            over_ns: 2,
        };
        let v = serde_json::to_value(cpu.to_wire()).expect("JSON");
        assert!(
            v.get("carried_ns").is_none() && v.get("over_ns").is_none(),
            "{v}"
        );
        let back = CpuTimes::from_wire(serde_json::from_value(v).expect("reads")).expect("maps");
        assert_eq!(
            back,
            CpuTimes {
                carried_ns: 0,
                over_ns: 0,
                ..cpu
            }
        );
        let old: CpuTimesForm =
            serde_json::from_str(r#"{"cpu": 1, "socket": 2}"#).expect("schema 3");
        assert_eq!(CpuTimes::from_wire(old).expect("maps").package, 2);
    }

    /// Standard types a recorded field may hold as they are.
    const STANDARD: &[&str] = &[
        "u8", "u16", "u32", "u64", "usize", "i32", "i64", "f64", "bool", "str", "String", "Vec",
        "Option", "Box", "Cow", "BTreeMap", "RawValue", "Self",
    ];

    /// The `with` paths that write a field through its form.
    const VIA: &[&str] = &[
        "via",
        "wire::via",
        "super::wire::via",
        "crate::model::wire::via",
    ];

    /// Every item of a file, those of inline modules included.
    fn all_items(file: &syn::File) -> Vec<&syn::Item> {
        let mut out = Vec::new();
        let mut stack: Vec<&syn::Item> = file.items.iter().collect();
        while let Some(item) = stack.pop() {
            if let syn::Item::Mod(m) = item
                && let Some((_, items)) = &m.content
            {
                stack.extend(items.iter());
            }
            out.push(item);
        }
        out
    }

    /// The type paths in `ty` that are neither standard, nor in `own`, nor
    /// one of `params`, nor model's by their path (`super::x`,
    /// `crate::model::x`): each as written.
    fn foreign_paths(
        ty: &syn::Type,
        own: &BTreeSet<String>,
        params: &BTreeSet<String>,
    ) -> Vec<String> {
        let mut paths = TypePaths::default();
        syn::visit::Visit::visit_type(&mut paths, ty);
        paths
            .0
            .into_iter()
            .filter(|path| {
                let last = path.last().cloned().unwrap_or_default();
                let from_below = path.len() > 1
                    && matches!(path[0].as_str(), "crate" | "super")
                    && path.get(1).map(String::as_str) != Some("model")
                    && !(path[0] == "super" && own.contains(&last));
                let known = STANDARD.contains(&last.as_str())
                    || own.contains(&last)
                    || params.contains(&last);
                from_below || !known
            })
            .map(|path| path.join("::"))
            .collect()
    }

    /// Which fields of the types a model file serializes (a plain
    /// `#[derive(Serialize)]` or `Deserialize`, in inline modules too)
    /// name a type that is neither model's own (`own`), nor standard, nor
    /// written through `wire::via`: each is `Type.field: TypeName`.
    fn foreign_fields(source: &str, own: &BTreeSet<String>) -> Vec<String> {
        let file = syn::parse_file(source).expect("a model file parses");
        let mut found = Vec::new();
        for item in all_items(&file) {
            let (name, attrs, generics, fields): (_, _, _, Vec<&syn::Field>) = match item {
                syn::Item::Struct(s) => {
                    (&s.ident, &s.attrs, &s.generics, s.fields.iter().collect())
                }
                syn::Item::Enum(e) => (
                    &e.ident,
                    &e.attrs,
                    &e.generics,
                    e.variants.iter().flat_map(|v| v.fields.iter()).collect(),
                ),
                _ => continue,
            };
            let serialized = attrs
                .iter()
                .filter(|a| a.path().is_ident("derive"))
                .any(|a| {
                    nested(a)
                        .iter()
                        .any(|(k, _)| k == "Serialize" || k == "Deserialize")
                });
            if !serialized {
                continue;
            }
            let params: BTreeSet<String> = generics
                .type_params()
                .map(|p| p.ident.to_string())
                .collect();
            for field in fields {
                let via = field
                    .attrs
                    .iter()
                    .filter(|a| a.path().is_ident("serde"))
                    .any(|a| {
                        nested(a).iter().any(|(k, v)| {
                            k == "with" && v.as_deref().is_some_and(|w| VIA.contains(&w))
                        })
                    });
                if via {
                    continue;
                }
                for path in foreign_paths(&field.ty, own, &params) {
                    let field = field.ident.as_ref().map(ToString::to_string);
                    found.push(format!("{name}.{}: {path}", field.unwrap_or_default()));
                }
            }
        }
        found
    }

    /// Every type path in a type, as its segments.
    #[derive(Default)]
    struct TypePaths(Vec<Vec<String>>);

    impl<'ast> syn::visit::Visit<'ast> for TypePaths {
        fn visit_type_path(&mut self, p: &'ast syn::TypePath) {
            self.0.push(
                p.path
                    .segments
                    .iter()
                    .map(|s| s.ident.to_string())
                    .collect(),
            );
            syn::visit::visit_type_path(self, p);
        }
    }

    /// An attribute's list, `#[a(k, p::k, k = "v")]`, as (last segment
    /// of each key, its string value); a nested list (`bound(...)`) is
    /// skipped.
    fn nested(a: &syn::Attribute) -> Vec<(String, Option<String>)> {
        let mut out = Vec::new();
        let parsed = a.parse_nested_meta(|m| {
            let key = m
                .path
                .segments
                .last()
                .map(|s| s.ident.to_string())
                .unwrap_or_default();
            let value = if m.input.peek(syn::Token![=]) {
                Some(m.value()?.parse::<syn::LitStr>()?.value())
            } else {
                if m.input.peek(syn::token::Paren) {
                    let _skipped: proc_macro2::TokenStream = m.input.parse()?;
                }
                None
            };
            out.push((key, value));
            Ok(())
        });
        parsed.expect("a model attribute parses");
        out
    }

    /// Every `.rs` file under `dir`, by its path under `src/`.
    fn rust_files(dir: &Path, out: &mut Vec<(String, String)>) {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for entry in std::fs::read_dir(dir)
            .expect("read a model directory")
            .flatten()
        {
            let p = entry.path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).expect("read");
                out.push((
                    p.strip_prefix(&src).unwrap_or(&p).display().to_string(),
                    text,
                ));
            }
        }
    }

    fn model_files() -> Vec<(String, String)> {
        let mut files = Vec::new();
        rust_files(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src/model"),
            &mut files,
        );
        files.sort();
        files
    }

    /// The types model declares: its structs and enums, and its aliases
    /// whose every type is standard or model's own (an alias of a lower
    /// type is not model's).
    fn own_types(files: &[(String, String)]) -> BTreeSet<String> {
        let parsed: Vec<syn::File> = files
            .iter()
            .map(|(_, text)| syn::parse_file(text).expect("parses"))
            .collect();
        let items: Vec<&syn::Item> = parsed.iter().flat_map(all_items).collect();
        let mut own: BTreeSet<String> = items
            .iter()
            .filter_map(|item| match item {
                syn::Item::Struct(s) => Some(s.ident.to_string()),
                syn::Item::Enum(e) => Some(e.ident.to_string()),
                _ => None,
            })
            .collect();
        // Aliases of aliases: until nothing more is accepted.
        loop {
            let before = own.len();
            for item in &items {
                if let syn::Item::Type(a) = item {
                    let params = a
                        .generics
                        .type_params()
                        .map(|p| p.ident.to_string())
                        .collect();
                    if foreign_paths(&a.ty, &own, &params).is_empty() {
                        own.insert(a.ident.to_string());
                    }
                }
            }
            if own.len() == before {
                return own;
            }
        }
    }

    /// What a rename inside the profiler could reach: a recorded field of
    /// a lower layer's type, serialized as that type's derive writes it.
    /// Every one goes through its form here instead.
    #[test]
    fn every_recorded_field_is_the_schema_s_own() {
        let files = model_files();
        assert!(files.len() >= 5, "{files:?}");
        let own = own_types(&files);
        let foreign: Vec<String> = files
            .iter()
            .flat_map(|(path, text)| {
                foreign_fields(text, &own)
                    .into_iter()
                    .map(move |f| format!("{path}: {f}"))
            })
            .collect();
        assert!(
            foreign.is_empty(),
            "recorded fields of types model does not own (add a form in model/wire.rs \
             and `#[serde(with = \"wire::via\")]`):\n{}",
            foreign.join("\n")
        );
    }

    #[test]
    fn the_check_finds_a_lower_type_serialized_as_it_is() {
        let source = r#"
            #[derive(Serialize, Deserialize)]
            pub(crate) struct EnergyJ { j: f64 }
            type Tk = crate::tracker::TrackerKind;
            type Rows = Vec<EnergyJ>;
            #[derive(Serialize, Deserialize)]
            pub(crate) struct Report {
                energy: EnergyJ,
                rows: Rows,
                tracker: crate::tracker::TrackerKind,
                aliased: Tk,
                #[serde(with = "wire::via")]
                mapped: crate::tracker::TaskClock,
                #[serde(with = "elsewhere::not_via")]
                elsewhere: crate::tracker::TaskClock,
                gpus: Vec<GpuInfo>,
                counts: Option<Vec<u64>>,
            }
            mod inner {
                #[derive(serde::Serialize)]
                #[serde(bound(serialize = "T: Serialize"))]
                struct Hidden<T> { x: crate::tracker::TrackerKind, t: T }
            }
            struct NotRecorded { x: crate::tracker::TrackerKind }
        "#;
        let own = own_types(&[("x.rs".to_string(), source.to_string())]);
        assert!(own.contains("Rows") && !own.contains("Tk"), "{own:?}");
        let mut found = foreign_fields(source, &own);
        found.sort();
        assert_eq!(
            found,
            [
                "Hidden.x: crate::tracker::TrackerKind",
                "Report.aliased: Tk",
                "Report.elsewhere: crate::tracker::TaskClock",
                "Report.gpus: GpuInfo",
                "Report.tracker: crate::tracker::TrackerKind",
            ]
        );
    }
}
