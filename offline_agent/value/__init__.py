"""The learned value model V(state, action), fitted on the stored search trees: what
search.critic: learned scores proposals with (LearnedCritic) and mining's eq. 10 reads."""
