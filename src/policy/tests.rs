//! Properties every policy, or a family of policies, must keep: names, per-leg instances,
//! distributions, and hash stability under membership change.

use std::collections::HashMap;
use std::sync::Arc;

use super::fixtures::{fleet, idle, loaded};
use super::*;

fn prefill(name: PolicyName) -> Arc<dyn Policy> {
    build(name, PolicyLeg::Prefill, &PolicyParams::default()).unwrap()
}

#[test]
fn policy_names_round_trip_through_smg_spelling() {
    for name in PolicyName::ALL {
        assert_eq!(name.as_str().parse::<PolicyName>(), Ok(name));
        let policy = build(name, PolicyLeg::Prefill, &PolicyParams::default()).unwrap();
        assert_eq!(policy.name(), name.as_str());
    }
    assert!("least-load".parse::<PolicyName>().is_err());
    assert_eq!("min_group".parse(), Ok(AssignmentMode::MinGroup));
}

#[test]
fn only_text_hungry_policies_ask_for_the_prompt() {
    let wants: Vec<&str> = PolicyName::ALL
        .into_iter()
        .filter(|&n| prefill(n).needs_text())
        .map(PolicyName::as_str)
        .collect();
    assert_eq!(wants, ["cache_aware", "prefix_hash", "bucket"]);
}

#[test]
fn every_policy_declines_an_empty_list_and_takes_a_lone_worker() {
    let urls = fleet(1);
    let one = idle(&urls);
    let input = RoutingInput {
        text: Some("hello"),
        routing_key: Some("k"),
        prompt_len: 5,
        ..Default::default()
    };
    for name in PolicyName::ALL {
        let p = prefill(name);
        assert_eq!(p.select(&[], &input), None, "{name}");
        assert_eq!(p.select(&one, &input), Some(0), "{name}");
        p.on_selected(&one[0], &input);
    }
}

#[test]
fn every_policy_returns_an_index_of_the_list_it_was_given() {
    let urls = fleet(64);
    let all = idle(&urls);
    for name in PolicyName::ALL {
        let p = prefill(name);
        for round in 0..200usize {
            // A shrinking, shifting list: indices must always be into *this* slice.
            let list = &all[round % 7..64 - round % 5];
            let prompt = format!("prompt {} {}", round % 13, "x".repeat(round));
            let key = format!("key-{}", round % 17);
            let input = RoutingInput {
                text: Some(&prompt),
                routing_key: Some(&key),
                prompt_len: prompt.len(),
                ..Default::default()
            };
            let i = p.select(list, &input).unwrap();
            assert!(i < list.len(), "{name}");
            p.on_selected(&list[i], &input);
        }
    }
}

#[test]
fn round_robin_alternates_exactly_and_each_leg_keeps_its_own_counter() {
    let urls = fleet(3);
    let list = idle(&urls);
    let none = RoutingInput::default();
    let prefill_rr = prefill(PolicyName::RoundRobin);
    let decode_rr = build(
        PolicyName::RoundRobin,
        PolicyLeg::Decode,
        &PolicyParams::default(),
    )
    .unwrap();
    let picks: Vec<usize> = (0..9)
        .map(|_| prefill_rr.select(&list, &none).unwrap())
        .collect();
    assert_eq!(picks, [0, 1, 2, 0, 1, 2, 0, 1, 2]);
    // The decode instance starts its own rotation.
    assert_eq!(decode_rr.select(&list, &none), Some(0));
    assert_eq!(prefill_rr.select(&list, &none), Some(0));
}

#[test]
fn random_is_roughly_uniform_over_10k_picks() {
    let urls = fleet(4);
    let list = idle(&urls);
    let p = prefill(PolicyName::Random);
    let mut counts = [0u32; 4];
    for _ in 0..10_000 {
        counts[p.select(&list, &RoutingInput::default()).unwrap()] += 1;
    }
    // Expected 2500 each; σ ≈ 43, so ±300 is ~7σ.
    for c in counts {
        assert!((2200..2800).contains(&c), "{counts:?}");
    }
}

#[test]
fn passthrough_takes_the_first_available() {
    let urls = fleet(3);
    let p = prefill(PolicyName::Passthrough);
    assert_eq!(p.select(&idle(&urls), &RoutingInput::default()), Some(0));
}

/// Route 10k keys with `key_input` and return each key's worker URL.
fn assignments<'u>(
    p: &dyn Policy,
    list: &[Candidate<'u>],
    key_input: &dyn Fn(&str) -> RoutingInput<'_>,
) -> Vec<&'u str> {
    (0..10_000)
        .map(|k| {
            let key = format!("user-{k}");
            list[p.select(list, &key_input(&key)).unwrap()].url
        })
        .collect()
}

fn check_join_and_leave_move_about_one_nth(
    name: PolicyName,
    key_input: &dyn Fn(&str) -> RoutingInput<'_>,
) {
    let urls = fleet(5);
    let four = idle(&urls[..4]);
    let five = idle(&urls);
    let p = prefill(name);
    let before = assignments(&*p, &four, key_input);

    // A 5th worker joins: about 1/5 of the keys move, all of them to the newcomer.
    p.on_worker_added(&urls[4]);
    let after_join = assignments(&*p, &five, key_input);
    let moved: Vec<usize> = (0..10_000)
        .filter(|&k| before[k] != after_join[k])
        .collect();
    assert!(
        (1_300..2_700).contains(&moved.len()),
        "{name}: {} of 10000 keys moved on join (expected ≈2000)",
        moved.len()
    );
    assert!(
        moved.iter().all(|&k| after_join[k] == urls[4]),
        "{name}: a key moved between old workers"
    );

    // Worker 1 leaves: only its keys move, and the others stay put.
    p.on_worker_removed(&urls[1]);
    let rest: Vec<Candidate> = five.iter().copied().filter(|c| c.url != urls[1]).collect();
    let after_leave = assignments(&*p, &rest, key_input);
    for k in 0..10_000 {
        if after_join[k] == urls[1] {
            assert_ne!(after_leave[k], urls[1]);
        } else {
            assert_eq!(
                after_leave[k], after_join[k],
                "{name}: key {k} moved needlessly"
            );
        }
    }
}

#[test]
fn consistent_hashing_moves_about_a_fifth_of_keys_when_a_fifth_worker_joins() {
    check_join_and_leave_move_about_one_nth(PolicyName::ConsistentHashing, &|key| RoutingInput {
        routing_key: Some(key),
        ..Default::default()
    });
}

#[test]
fn prefix_hash_moves_about_a_fifth_of_prompts_when_a_fifth_worker_joins() {
    check_join_and_leave_move_about_one_nth(PolicyName::PrefixHash, &|key| RoutingInput {
        text: Some(key),
        ..Default::default()
    });
}

#[test]
fn hash_rings_learn_an_unannounced_worker_from_the_candidates() {
    for name in [PolicyName::ConsistentHashing, PolicyName::PrefixHash] {
        let urls = fleet(5);
        let p = prefill(name);
        let _ = assignments(&*p, &idle(&urls[..4]), &|k| RoutingInput {
            routing_key: Some(k),
            ..Default::default()
        });
        // No on_worker_added: the 5th worker must still receive its share.
        let after = assignments(&*p, &idle(&urls), &|k| RoutingInput {
            routing_key: Some(k),
            ..Default::default()
        });
        let newcomer = after.iter().filter(|u| **u == urls[4]).count();
        assert!((1_300..2_700).contains(&newcomer), "{name}: {newcomer}");
    }
}

#[test]
fn consistent_hashing_spreads_keys_evenly() {
    let urls = fleet(8);
    let list = idle(&urls);
    let p = prefill(PolicyName::ConsistentHashing);
    let mut counts: HashMap<&str, u32> = HashMap::new();
    for url in assignments(&*p, &list, &|k| RoutingInput {
        routing_key: Some(k),
        ..Default::default()
    }) {
        *counts.entry(url).or_default() += 1;
    }
    assert_eq!(counts.len(), 8);
    for (url, c) in counts {
        assert!(
            (850..1_650).contains(&c),
            "{url}: {c} of 10000 (expected ≈1250)"
        );
    }
}

#[test]
fn stateful_policies_keep_separate_state_per_leg() {
    let params = PolicyParams::default();
    let urls = fleet(8);
    let list = idle(&urls);
    let prefix = "a long shared system prompt ".repeat(50);
    let text = RoutingInput {
        text: Some(&prefix),
        ..Default::default()
    };
    let prefill_ca = build(PolicyName::CacheAware, PolicyLeg::Prefill, &params).unwrap();
    let decode_ca = build(PolicyName::CacheAware, PolicyLeg::Decode, &params).unwrap();
    // Teach only the prefill instance where the prompt lives, under load elsewhere.
    let home = prefill_ca.select(&list, &text).unwrap();
    prefill_ca.on_selected(&list[home], &text);
    let mut busy = list.clone();
    for (i, c) in busy.iter_mut().enumerate() {
        c.in_flight = if i == home { 3 } else { 0 };
    }
    assert_eq!(prefill_ca.select(&busy, &text), Some(home));
    // The decode instance has no affinity: min load, never the busy home.
    for _ in 0..50 {
        assert_ne!(decode_ca.select(&busy, &text), Some(home));
    }
}

/// Three workers whose reports all say "empty"; worker 0 keeps every request it is given (a slow
/// engine), the others finish theirs before the next pick. Returns worker 0's picks out of 300.
fn picks_of_a_worker_that_keeps_its_requests(p: &dyn Policy) -> usize {
    let urls = fleet(3);
    let empty = EngineLoad::default();
    let mut list = idle(&urls);
    for c in &mut list {
        c.load = Some(&empty);
    }
    let mut kept = 0;
    for _ in 0..300 {
        list[0].in_flight = kept;
        if p.select(&list, &RoutingInput::default()) == Some(0) {
            kept += 1;
        }
    }
    kept
}

#[test]
fn load_based_policies_send_nothing_more_to_a_worker_holding_requests_whose_report_says_empty() {
    // Before the in-flight term, both gave worker 0 about a third (the reports tie).
    for name in [PolicyName::LeastLoad, PolicyName::PowerOfTwo] {
        let kept = picks_of_a_worker_that_keeps_its_requests(&*prefill(name));
        // Its first pick may come from a three-way tie; after that it always has more in flight.
        assert!(kept <= 1, "{name}: {kept} of 300 picks");
    }
}

#[test]
fn load_based_policies_order_equal_in_flight_counts_by_the_report() {
    let urls = fleet(2);
    let queued = EngineLoad {
        waiting_requests: 2,
        token_usage: 0.5,
        ..Default::default()
    };
    let empty = EngineLoad::default();
    for name in [PolicyName::LeastLoad, PolicyName::PowerOfTwo] {
        let p = prefill(name);
        for n in [0, 5] {
            let mut list = loaded(&urls, &[n, n]);
            list[0].load = Some(&queued);
            list[1].load = Some(&empty);
            for _ in 0..50 {
                assert_eq!(
                    p.select(&list, &RoutingInput::default()),
                    Some(1),
                    "{name}, {n} in flight on each"
                );
            }
        }
    }
}
