//! [`SmallList`]: items gathered in a hot path (te-core's submit: its checked requests, a
//! transport's slices),
//! kept without a heap allocation while there is only one, as for most small transfers.
//!
//! It only gathers and hands over: no removal, no ordering of its own.

/// A list that holds a single item inline and moves to a `Vec` at the second.
#[derive(Debug, Default)]
pub enum SmallList<T> {
    /// No item yet.
    #[default]
    Empty,
    /// One item, inline.
    One(T),
    /// Two or more.
    Many(Vec<T>),
}

impl<T> SmallList<T> {
    /// A list for about `count` items: inline for one, a `Vec` of that room for more.
    pub fn with_capacity(count: usize) -> Self {
        match count {
            0 | 1 => SmallList::Empty,
            n => SmallList::Many(Vec::with_capacity(n)),
        }
    }

    /// Adds `item` at the end.
    pub fn push(&mut self, item: T) {
        match self {
            SmallList::Many(all) => all.push(item),
            SmallList::Empty => *self = SmallList::One(item),
            SmallList::One(_) => {
                if let SmallList::One(first) = std::mem::take(self) {
                    *self = SmallList::Many(vec![first, item]);
                }
            }
        }
    }
}

impl<T> std::ops::Deref for SmallList<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            SmallList::Empty => &[],
            SmallList::One(item) => std::slice::from_ref(item),
            SmallList::Many(all) => all,
        }
    }
}

impl<T> std::ops::DerefMut for SmallList<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            SmallList::Empty => &mut [],
            SmallList::One(item) => std::slice::from_mut(item),
            SmallList::Many(all) => all,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SmallList;

    #[test]
    fn holds_one_inline_and_keeps_order_past_it() {
        let mut list = SmallList::with_capacity(1);
        assert!(list.is_empty());
        list.push(7);
        assert!(matches!(list, SmallList::One(7)));
        assert_eq!(&list[..], &[7]);
        list.push(8);
        list.push(9);
        assert!(matches!(list, SmallList::Many(_)));
        assert_eq!(&list[..], &[7, 8, 9]);
        assert_eq!(list.last(), Some(&9));
    }

    #[test]
    fn room_for_several_starts_as_a_vec() {
        let mut list = SmallList::with_capacity(3);
        match &list {
            SmallList::Many(v) => assert!(v.capacity() >= 3 && v.is_empty()),
            _ => panic!("expected a Vec with room for 3"),
        }
        list.push("a");
        assert!(matches!(&list, SmallList::Many(v) if v.as_slice() == ["a"]));
    }
}
