//! Unit tests of the static power figures and the host power model file.
use super::*;

#[test]
fn a_varied_load_is_learned_and_a_steady_one_falls_back_to_the_lowest() {
    let mut s = StaticPowers::new(None, Some("powercap"), None);
    // 23.7 W static + 11.3 W per busy CPU, 1 s intervals.
    let power = |cpus: f64| 23.7 + 11.3 * cpus;
    for i in 0..9 {
        let cpus = 1.0;
        s.observe(
            Domain::Package,
            Some(0),
            (power(cpus) * 1e6) as u64,
            1_000_000_000,
            cpus,
        );
        let f = s.figure(Domain::Package, Some(0)).expect("a figure");
        assert_eq!(f.source, StaticSource::LowestSeen, "interval {i}");
        assert!((f.static_w - power(1.0)).abs() < 1e-3);
    }
    // Steady: no fit however long.
    assert!(s.learned().is_empty());
    for i in 0..10 {
        let cpus = 0.2 + 0.15 * f64::from(i % 10);
        s.observe(
            Domain::Package,
            Some(0),
            (power(cpus) * 1e6) as u64,
            1_000_000_000,
            cpus,
        );
    }
    let f = s.figure(Domain::Package, Some(0)).expect("a figure");
    assert_eq!(f.source, StaticSource::Learned);
    assert!((f.static_w - 23.7).abs() < 1e-3, "{f:?}");
    assert!((f.per_cpu_w.unwrap_or(0.0) - 11.3).abs() < 1e-3, "{f:?}");
    // Another domain learns on its own.
    assert!(s.figure(Domain::Dram, Some(0)).is_none());
}

#[test]
fn the_host_model_comes_first_for_its_reader_only() {
    let machine = Machine {
        cpu_model: "x".into(),
        packages: 1,
        cpus: 2,
    };
    let model = HostModel {
        kind: "wattprof_power_model".into(),
        version: 1,
        host: "h".into(),
        machine,
        created_unix_ns: 0,
        fits: vec![DomainFit {
            domain: Domain::Package,
            package: Some(0),
            reader: "powercap".into(),
            static_w: 17.5,
            per_cpu_w: 9.0,
            r_squared: 0.999,
            rms_residual_w: 0.1,
            points: Vec::new(),
            origin: FitOrigin::Calibrate,
            learned: None,
        }],
        gpus: Vec::new(),
    };
    let mut s = StaticPowers::new(Some(&model), Some("powercap"), None);
    s.observe(Domain::Package, Some(0), 30_000_000, 1_000_000_000, 1.0);
    let f = s.figure(Domain::Package, Some(0)).expect("a figure");
    assert_eq!((f.source, f.static_w), (StaticSource::HostModel, 17.5));
    // The MSR reader's energy is not what was fitted.
    let mut s = StaticPowers::new(Some(&model), Some("msr"), None);
    s.observe(Domain::Package, Some(0), 30_000_000, 1_000_000_000, 1.0);
    let f = s.figure(Domain::Package, Some(0)).expect("a figure");
    assert_eq!(f.source, StaticSource::LowestSeen);
}

#[test]
fn a_model_from_another_machine_or_a_bad_file_is_one_line() {
    let dir = std::env::temp_dir().join(format!("wattprof-hostmodel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("power-model.json");
    let here = Machine {
        cpu_model: "Some CPU".into(),
        packages: 1,
        cpus: 8,
    };
    // None at the default place is no error; a given path must exist.
    assert_eq!(HostModel::load(&path, false, &here), Ok(None));
    assert!(
        HostModel::load(&path, true, &here)
            .expect_err("missing")
            .contains("wattprof calibrate")
    );
    let model = HostModel {
        kind: "wattprof_power_model".into(),
        version: 1,
        host: "h".into(),
        machine: Machine {
            cpus: 64,
            ..here.clone()
        },
        created_unix_ns: 0,
        fits: Vec::new(),
        gpus: Vec::new(),
    };
    model.save(&path).expect("save");
    let err = HostModel::load(&path, false, &here).expect_err("another machine");
    assert!(
        err.contains("made on another machine") && !err.contains('\n'),
        "{err}"
    );
    let model = HostModel {
        machine: here.clone(),
        ..model
    };
    model.save(&path).expect("save");
    assert!(HostModel::load(&path, false, &here).is_ok_and(|m| m.is_some()));
    std::fs::write(&path, "{\"type\": 3}").expect("write");
    let err = HostModel::load(&path, false, &here).expect_err("garbage");
    assert!(err.contains("not a wattprof power model"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn what_a_monitor_learns_is_kept_and_learning_goes_on_from_it() {
    let machine = Machine {
        cpu_model: "x".into(),
        packages: 1,
        cpus: 2,
    };
    let mut model = HostModel {
        kind: "wattprof_power_model".into(),
        version: 1,
        host: "h".into(),
        machine,
        created_unix_ns: 0,
        fits: Vec::new(),
        gpus: Vec::new(),
    };
    // 19.4 W + 7.7 W per busy CPU on the package and on the DRAM.
    let power = |cpus: f64| 19.4 + 7.7 * cpus;
    let mut s = StaticPowers::new(None, Some("powercap"), None);
    for i in 0..20 {
        let cpus = 0.1 * f64::from(i % 10) + 0.2;
        for d in [Domain::Package, Domain::Dram] {
            s.observe(d, Some(0), (power(cpus) * 1e6) as u64, 1_000_000_000, cpus);
        }
    }
    // The DRAM was calibrated: a learned figure never replaces it.
    model.fits.push(DomainFit {
        domain: Domain::Dram,
        package: Some(0),
        reader: "powercap".into(),
        static_w: 1.3,
        per_cpu_w: 0.4,
        r_squared: 0.99,
        rms_residual_w: 0.0,
        points: Vec::new(),
        origin: FitOrigin::Calibrate,
        learned: None,
    });
    assert!(s.merge_into(&mut model, "powercap"));
    assert_eq!(model.fits.len(), 2);
    let pkg = model
        .fits
        .iter()
        .find(|f| f.domain == Domain::Package)
        .expect("learned");
    assert_eq!(pkg.origin, FitOrigin::Learned);
    assert!((pkg.static_w - 19.4).abs() < 1e-6, "{pkg:?}");
    assert_eq!(
        model
            .fits
            .iter()
            .find(|f| f.domain == Domain::Dram)
            .map(|f| f.static_w),
        Some(1.3)
    );
    // Through the file's format, the next profile starts from it: a
    // learned figure at once, with every point so far.
    let model: HostModel =
        serde_json::from_str(&serde_json::to_string(&model).expect("json")).expect("back");
    let next = StaticPowers::new(Some(&model), Some("powercap"), None);
    let f = next.figure(Domain::Package, Some(0)).expect("a figure");
    assert_eq!(f.source, StaticSource::Learned);
    assert!((f.static_w - 19.4).abs() < 1e-6);
    assert_eq!(next.learned()[0].5, 20, "its 20 intervals");
    let f = next.figure(Domain::Dram, Some(0)).expect("a figure");
    assert_eq!((f.source, f.static_w), (StaticSource::HostModel, 1.3));
}
