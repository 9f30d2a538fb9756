//! The approximate radix tree behind `cache_aware`: which workers were sent which prompt
//! prefixes.
//!
//! One tree per policy instance (per leg), shared by all workers: every node records the workers
//! ("owners") that were routed a prompt passing through it. Ownership is prefix-closed: an owner
//! of a node owns all its ancestors. "Approximate" because it models what the gateway routed, not
//! what the engines actually still cache.
//!
//! Size is the total label length (bytes of text, or tokens) and is kept at or below `max_size`
//! on every insert by evicting least-recently-inserted leaves. Inserting touches the path
//! deepest-first, so a parent is always more recent than its children and the LRU tail is always a
//! leaf; eviction is O(evicted), never a tree walk.
//!
//! Deviation from SMG: SMG bounds each worker's share separately (`evict_tenant_by_size` every
//! `eviction_interval`); this tree bounds the whole tree continuously. Memory is therefore
//! bounded by `max_size` regardless of the number of workers.

const ROOT: u32 = 0;
const NIL: u32 = u32::MAX;

/// A tree symbol: a byte of text or a token id.
pub(crate) trait Symbol: Copy + Eq {
    /// Length of the common prefix of `a` and `b`.
    fn common_prefix(a: &[Self], b: &[Self]) -> usize;
}

impl Symbol for u8 {
    #[inline]
    fn common_prefix(a: &[u8], b: &[u8]) -> usize {
        let n = a.len().min(b.len());
        let mut i = 0;
        // Long equal runs (shared system prompts, multi-turn history) go through memcmp, which
        // is vectorised; only the chunk holding the first difference is searched word by word.
        const CHUNK: usize = 512;
        while i + CHUNK <= n && a[i..i + CHUNK] == b[i..i + CHUNK] {
            i += CHUNK;
        }
        while i + 8 <= n {
            let x = u64::from_le_bytes(a[i..i + 8].try_into().expect("8 bytes"))
                ^ u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
            if x != 0 {
                return i + (x.trailing_zeros() / 8) as usize;
            }
            i += 8;
        }
        while i < n && a[i] == b[i] {
            i += 1;
        }
        i
    }
}

impl Symbol for u32 {
    #[inline]
    fn common_prefix(a: &[u32], b: &[u32]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }
}

struct Node<T> {
    label: Vec<T>,
    /// (first symbol of the child's label, child).
    children: Vec<(T, u32)>,
    parent: u32,
    owners: Vec<u32>,
    /// LRU neighbours: `prev` is more recent, `next` less recent.
    prev: u32,
    next: u32,
}

pub(crate) struct RadixTree<T: Symbol> {
    nodes: Vec<Node<T>>,
    free: Vec<u32>,
    /// Most recently inserted node.
    lru_head: u32,
    /// Least recently inserted node (always a leaf).
    lru_tail: u32,
    size: usize,
    max_size: usize,
    /// Scratch for the insert path, reused to keep inserts allocation-light.
    path: Vec<u32>,
}

/// Result of [`RadixTree::longest_match`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Match {
    /// Symbols of the key held by at least one accepted owner.
    pub(crate) matched: usize,
    /// The deepest node reached; its owners hold the matched prefix.
    pub(crate) node: u32,
}

impl<T: Symbol> RadixTree<T> {
    pub(crate) fn new(max_size: usize) -> RadixTree<T> {
        RadixTree {
            nodes: vec![Node {
                label: Vec::new(),
                children: Vec::new(),
                parent: NIL,
                owners: Vec::new(),
                prev: NIL,
                next: NIL,
            }],
            free: Vec::new(),
            lru_head: NIL,
            lru_tail: NIL,
            size: 0,
            max_size,
            path: Vec::new(),
        }
    }

    /// Total label length held.
    #[cfg(test)]
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Nodes in use, the root excluded.
    #[cfg(test)]
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len() - 1 - self.free.len()
    }

    pub(crate) fn owners(&self, node: u32) -> &[u32] {
        &self.nodes[node as usize].owners
    }

    fn child(&self, node: u32, first: T) -> Option<u32> {
        self.nodes[node as usize]
            .children
            .iter()
            .find(|(s, _)| *s == first)
            .map(|&(_, c)| c)
    }

    /// The longest prefix of `key` held by an owner for which `accept` is true (an available
    /// worker), and the deepest node on it. Read-only.
    pub(crate) fn longest_match(&self, key: &[T], mut accept: impl FnMut(u32) -> bool) -> Match {
        let mut at = Match {
            matched: 0,
            node: ROOT,
        };
        while at.matched < key.len() {
            let Some(child) = self.child(at.node, key[at.matched]) else {
                break;
            };
            let node = &self.nodes[child as usize];
            if !node.owners.iter().any(|&o| accept(o)) {
                break;
            }
            let common = T::common_prefix(&node.label, &key[at.matched..]);
            at = Match {
                matched: at.matched + common,
                node: child,
            };
            if common < node.label.len() {
                break;
            }
        }
        at
    }

    /// Record that `owner` was sent `key`, then evict down to the size bound.
    pub(crate) fn insert(&mut self, key: &[T], owner: u32) {
        if key.is_empty() {
            return;
        }
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        let mut node = ROOT;
        let mut pos = 0;
        while pos < key.len() {
            let Some(child) = self.child(node, key[pos]) else {
                let leaf = self.alloc(key[pos..].to_vec(), node, vec![owner]);
                self.nodes[node as usize].children.push((key[pos], leaf));
                self.size += key.len() - pos;
                path.push(leaf);
                break;
            };
            let label_len = self.nodes[child as usize].label.len();
            let common = T::common_prefix(&self.nodes[child as usize].label, &key[pos..]);
            let reached = if common < label_len {
                self.split(node, child, common)
            } else {
                child
            };
            add_owner(&mut self.nodes[reached as usize].owners, owner);
            path.push(reached);
            pos += common;
            node = reached;
        }
        for &n in path.iter().rev() {
            self.lru_unlink(n);
            self.lru_push_front(n);
        }
        self.path = path;
        self.evict_to(self.max_size);
    }

    /// Forget `owner` everywhere and drop the nodes nobody owns any more. O(nodes); runs only when
    /// a worker leaves the fleet.
    pub(crate) fn remove_owner(&mut self, owner: u32) {
        let mut stack = vec![ROOT];
        while let Some(n) = stack.pop() {
            let children = std::mem::take(&mut self.nodes[n as usize].children);
            let mut kept = Vec::with_capacity(children.len());
            for (first, c) in children {
                let owners = &mut self.nodes[c as usize].owners;
                owners.retain(|&o| o != owner);
                if owners.is_empty() {
                    // Prefix-closed ownership: nobody owns anything below either.
                    self.free_subtree(c);
                } else {
                    kept.push((first, c));
                    stack.push(c);
                }
            }
            self.nodes[n as usize].children = kept;
        }
    }

    /// Symbols owned by `owner` (test and diagnostics; O(nodes)).
    #[cfg(test)]
    pub(crate) fn owned_size(&self, owner: u32) -> usize {
        let mut total = 0;
        let mut stack = vec![ROOT];
        while let Some(n) = stack.pop() {
            for &(_, c) in &self.nodes[n as usize].children {
                let node = &self.nodes[c as usize];
                if node.owners.contains(&owner) {
                    total += node.label.len();
                }
                stack.push(c);
            }
        }
        total
    }

    /// Split `child` (a child of `parent`) after `at` symbols; returns the new middle node,
    /// which holds the first `at` symbols and inherits the child's owners.
    fn split(&mut self, parent: u32, child: u32, at: usize) -> u32 {
        let head: Vec<T> = self.nodes[child as usize].label[..at].to_vec();
        let owners = self.nodes[child as usize].owners.clone();
        let first = head[0];
        let mid = self.alloc(head, parent, owners);
        let tail_first = {
            let c = &mut self.nodes[child as usize];
            c.label.drain(..at);
            c.parent = mid;
            c.label[0]
        };
        self.nodes[mid as usize].children.push((tail_first, child));
        let slot = self.nodes[parent as usize]
            .children
            .iter_mut()
            .find(|(s, _)| *s == first)
            .expect("split child is a child of parent");
        slot.1 = mid;
        mid
    }

    fn alloc(&mut self, label: Vec<T>, parent: u32, owners: Vec<u32>) -> u32 {
        let node = Node {
            label,
            children: Vec::new(),
            parent,
            owners,
            prev: NIL,
            next: NIL,
        };
        let id = if let Some(id) = self.free.pop() {
            self.nodes[id as usize] = node;
            id
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        };
        self.lru_push_front(id);
        id
    }

    fn evict_to(&mut self, max_size: usize) {
        while self.size > max_size && self.lru_tail != NIL {
            let victim = self.lru_tail;
            let parent = self.nodes[victim as usize].parent;
            self.nodes[parent as usize]
                .children
                .retain(|&(_, c)| c != victim);
            // The tail is a leaf by construction; free_subtree stays correct even if it weren't.
            self.free_subtree(victim);
        }
    }

    /// Free `top` and everything below it. The caller unlinks `top` from its parent.
    fn free_subtree(&mut self, top: u32) {
        let mut stack = vec![top];
        while let Some(n) = stack.pop() {
            self.lru_unlink(n);
            let node = &mut self.nodes[n as usize];
            self.size -= node.label.len();
            stack.extend(node.children.drain(..).map(|(_, c)| c));
            node.label = Vec::new();
            node.owners = Vec::new();
            node.parent = NIL;
            self.free.push(n);
        }
    }

    fn lru_unlink(&mut self, n: u32) {
        let (prev, next) = {
            let node = &self.nodes[n as usize];
            (node.prev, node.next)
        };
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else if self.lru_head == n {
            self.lru_head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else if self.lru_tail == n {
            self.lru_tail = prev;
        }
        let node = &mut self.nodes[n as usize];
        node.prev = NIL;
        node.next = NIL;
    }

    fn lru_push_front(&mut self, n: u32) {
        let old_head = self.lru_head;
        {
            let node = &mut self.nodes[n as usize];
            node.prev = NIL;
            node.next = old_head;
        }
        if old_head != NIL {
            self.nodes[old_head as usize].prev = n;
        }
        self.lru_head = n;
        if self.lru_tail == NIL {
            self.lru_tail = n;
        }
    }
}

fn add_owner(owners: &mut Vec<u32>, owner: u32) {
    if !owners.contains(&owner) {
        owners.push(owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matched(tree: &RadixTree<u8>, key: &str, owner: u32) -> usize {
        tree.longest_match(key.as_bytes(), |o| o == owner).matched
    }

    #[test]
    fn match_finds_the_longest_prefix_held_by_an_accepted_owner() {
        let mut tree = RadixTree::<u8>::new(1 << 20);
        tree.insert(b"hello world", 1);
        tree.insert(b"hello there", 2);
        assert_eq!(matched(&tree, "hello world!", 1), 11);
        assert_eq!(matched(&tree, "hello world!", 2), 6);
        assert_eq!(matched(&tree, "help", 1), 3);
        assert_eq!(matched(&tree, "xyz", 1), 0);
        let m = tree.longest_match(b"hello", |_| true);
        assert_eq!(m.matched, 5);
        let mut owners = tree.owners(m.node).to_vec();
        owners.sort();
        assert_eq!(owners, vec![1, 2]);
    }

    #[test]
    fn size_counts_each_shared_symbol_once() {
        let mut tree = RadixTree::<u8>::new(1 << 20);
        tree.insert(b"abcdef", 1);
        tree.insert(b"abcxyz", 2);
        tree.insert(b"abcdef", 2);
        assert_eq!(tree.size(), 9);
        assert_eq!(tree.owned_size(1), 6);
        assert_eq!(tree.owned_size(2), 9);
    }

    #[test]
    fn eviction_keeps_the_tree_within_its_bound_and_drops_the_oldest_prompts() {
        let mut tree = RadixTree::<u8>::new(100);
        for i in 0..50 {
            tree.insert(
                format!("prompt-{i:03}-{}", "x".repeat(20)).as_bytes(),
                i % 3,
            );
            assert!(tree.size() <= 100, "size {}", tree.size());
        }
        let newest = format!("prompt-049-{}", "x".repeat(20));
        assert_eq!(
            tree.longest_match(newest.as_bytes(), |_| true).matched,
            newest.len()
        );
        let oldest = format!("prompt-000-{}", "x".repeat(20));
        assert!(tree.longest_match(oldest.as_bytes(), |_| true).matched < oldest.len());
    }

    #[test]
    fn removing_an_owner_frees_what_only_it_held() {
        let mut tree = RadixTree::<u8>::new(1 << 20);
        tree.insert(b"shared prefix, then one", 1);
        tree.insert(b"shared prefix, then two", 2);
        tree.remove_owner(1);
        assert_eq!(tree.owned_size(1), 0);
        assert_eq!(tree.size(), "shared prefix, then two".len());
        assert_eq!(
            matched(&tree, "shared prefix, then one", 2),
            "shared prefix, then ".len()
        );
        tree.remove_owner(2);
        assert_eq!(tree.size(), 0);
        assert_eq!(tree.node_count(), 0);
    }

    #[test]
    fn token_trees_match_by_token() {
        let mut tree = RadixTree::<u32>::new(1 << 20);
        tree.insert(&[1, 2, 3, 4], 7);
        assert_eq!(tree.longest_match(&[1, 2, 3, 9], |_| true).matched, 3);
    }

    #[test]
    fn byte_common_prefix_agrees_with_the_naive_definition() {
        let base: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 251) as u8).collect();
        for cut in [0, 1, 7, 8, 9, 511, 512, 513, 1024, 2999] {
            let mut other = base.clone();
            other[cut] ^= 0xff;
            assert_eq!(u8::common_prefix(&base, &other), cut);
        }
        assert_eq!(u8::common_prefix(&base, &base[..1000]), 1000);
    }
}
